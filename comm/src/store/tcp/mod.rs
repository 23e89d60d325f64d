//! The built-in TCP store: rank 0 serves it ([`TcpStoreServer`]), every
//! rank (rank 0 included) connects to it ([`TcpStore`]).
//!
//! The protocol is one JSON object per line, lines bounded in length
//! ([`MAX_LINE`]; [`MAX_HELLO_LINE`] before the hello). Every connection
//! opens with a hello: protocol [`VERSION`], the job token, the rank and
//! the world size. A newcomer has [`HELLO_TIMEOUT`] to present a valid
//! one; a wrong token, another world size, a rank out of range, garbage
//! or silence is refused with a reason, logged (`tracing::warn!`) and the
//! connection closed, and the store serves on. Then requests — set, get
//! (with a timeout), add, check, bye — each answered in order. Several
//! connections may present the same rank (a rank's watcher thread has its
//! own).
//!
//! A connection that said hello and closes without saying bye, while the
//! store is not closing, is a rank that vanished (killed, crashed): the
//! server publishes the job's abort notice under
//! [`ABORT_KEY`](super::ABORT_KEY) ([`abort::notice`](super::abort::notice))
//! unless one is already there, which is how a `kill -9`'d rank reaches
//! every survivor. When the server itself closes, it tells every
//! connection so ([`TcpStore::server_closed`]): a clean close is not a
//! crash.

use std::time::Duration;

mod client;
mod proto;
mod server;

pub use client::TcpStore;
pub use proto::{MAX_HELLO_LINE, MAX_LINE, VERSION};
pub use server::TcpStoreServer;

/// How long a new connection may take to present its hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
