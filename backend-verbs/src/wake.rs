//! Waking an idle rank when the NIC completes something: the rank sleeps
//! on its bell ([`Job::bell`](ringcc_comm::transport::Job::bell), a
//! futex), which no NIC can ring, so one thread per communicator sleeps
//! on the NICs' completion channels instead and rings the bell for them
//! (as TCP's reader threads do).
//!
//! No wake-up is lost: the thread re-arms a CQ (`ibv_req_notify_cq`)
//! before it rings, so a completion either raises a later event, or
//! happened before the ring — and the rank's last poll after arming its
//! bell sees it, or the ring wakes it (the bell's handshake).
//!
//! The thread lives as long as the [`Waker`]: the transport and every end
//! hold it, the last to go stops and joins the thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ringcc_comm::transport::Bell;
use tracing::warn;

use crate::ib::cq::{wait_any, CqChannel};

/// The longest the thread sleeps before it looks at its stop flag.
const TURN: Duration = Duration::from_millis(20);

/// The waker thread of one communicator's verbs ends.
#[derive(Debug)]
pub(crate) struct Waker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Waker {
    /// Starts the thread that rings `bell` on every event of `channels`.
    pub fn start(channels: Vec<Arc<CqChannel>>, bell: Arc<dyn Bell>) -> std::io::Result<Waker> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("ringcc-verbs-wake".into())
            .spawn({
                let stop = Arc::clone(&stop);
                move || run(&channels, &*bell, &stop)
            })?;
        Ok(Waker {
            stop,
            thread: Some(thread),
        })
    }
}

fn run(channels: &[Arc<CqChannel>], bell: &dyn Bell, stop: &AtomicBool) {
    let mut warned = false;
    while !stop.load(Ordering::Acquire) {
        match wait_any(channels, TURN) {
            Ok(true) => bell.ring(),
            Ok(false) => {}
            Err(e) => {
                // The rank still wakes at its bell's timeout: slower, not
                // stuck. Say so once.
                if !warned {
                    warn!("verbs: completion events failed, idle ranks nap instead: {e}");
                    warned = true;
                }
                std::thread::sleep(TURN);
            }
        }
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
