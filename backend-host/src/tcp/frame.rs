//! The TCP transport's three wire formats, in the smoltcp shape: each a
//! fixed-size byte array (so a view needs no length check), a private
//! `field` module of byte ranges, big-endian integers, a `Repr` with a
//! total `parse` and an `emit`; codes are enums with an `Unknown(u8)`
//! variant.
//!
//! **Hello** (sender → receiver, once, [`HELLO_LEN`] = 40 bytes):
//!
//! ```text
//! bytes 0..4    magic "RCTH"
//! byte  4       version (1)
//! byte  5       channel
//! bytes 6..8    reserved, zero
//! bytes 8..16   FNV-1a hash of the job token (`token_hash`)
//! bytes 16..20  sender rank
//! bytes 20..24  receiver rank
//! bytes 24..32  FIFO slot bytes
//! bytes 32..40  FIFO slots per slice
//! ```
//!
//! **Reply** (receiver → sender, once, [`REPLY_LEN`] = 2 bytes): a verdict
//! byte (`'A'` accepted, `'R'` refused) and a [`Reason`] code.
//!
//! **Frame header** ([`FRAME_LEN`] = 32 bytes, both directions after the
//! reply), followed by `length` payload bytes:
//!
//! ```text
//! bytes 0..4    magic "RCTF"
//! byte  4       version (1)
//! byte  5       kind: 1 call header, 2 data, 3 credit, 4 goodbye
//! byte  6       flags: bit 0 LAST (the data frame ends a slice: it
//!               publishes tail = step + 1); other bits zero
//! byte  7       reserved, zero
//! bytes 8..12   payload length
//! bytes 12..16  reserved, zero
//! bytes 16..24  call sequence number (0 in a credit frame)
//! bytes 24..32  FIFO step the payload fills (call header: the step it
//!               precedes; credit: the receiver's new head; goodbye: the
//!               sender's next step or the receiver's head)
//! ```
//!
//! An end dropped in order sends a goodbye before it shuts the connection
//! down: its peer then knows that nothing more will come (the job is
//! over for that rank) and stays quiet; a connection that ends without
//! one (a killed process) is `PeerGone` at once.

/// Bytes of a hello.
pub const HELLO_LEN: usize = 40;
/// Bytes of a reply to a hello.
pub const REPLY_LEN: usize = 2;
/// Bytes of a frame header.
pub const FRAME_LEN: usize = 32;

/// The hello's magic number, `"RCTH"`.
const HELLO_MAGIC: [u8; 4] = *b"RCTH";
/// The frame's magic number, `"RCTF"`.
const FRAME_MAGIC: [u8; 4] = *b"RCTF";
/// The version of both formats.
const VERSION: u8 = 1;
/// The reply's verdict bytes.
const ACCEPTED: u8 = b'A';
const REFUSED: u8 = b'R';
/// The frame flag of a slice's last data frame.
const FLAG_LAST: u8 = 1;

mod field {
    use core::ops::Range;

    pub mod hello {
        use super::Range;
        pub const MAGIC: Range<usize> = 0..4;
        pub const VERSION: usize = 4;
        pub const CHANNEL: usize = 5;
        pub const RESERVED: Range<usize> = 6..8;
        pub const TOKEN: Range<usize> = 8..16;
        pub const SENDER: Range<usize> = 16..20;
        pub const RECEIVER: Range<usize> = 20..24;
        pub const SLOT_BYTES: Range<usize> = 24..32;
        pub const SLOTS_PER_SLICE: Range<usize> = 32..40;
    }

    pub mod frame {
        use super::Range;
        pub const MAGIC: Range<usize> = 0..4;
        pub const VERSION: usize = 4;
        pub const KIND: usize = 5;
        pub const FLAGS: usize = 6;
        pub const RESERVED_A: usize = 7;
        pub const LENGTH: Range<usize> = 8..12;
        pub const RESERVED_B: Range<usize> = 12..16;
        pub const SEQ: Range<usize> = 16..24;
        pub const STEP: Range<usize> = 24..32;
    }
}

/// Big-endian reads and writes of fixed arrays; a range outside the array
/// reads zeros and writes nothing (never the case for the constants above).
fn get<const L: usize>(data: &[u8], range: core::ops::Range<usize>) -> [u8; L] {
    data.get(range)
        .and_then(|s| <[u8; L]>::try_from(s).ok())
        .unwrap_or([0; L])
}

fn put(data: &mut [u8], range: core::ops::Range<usize>, bytes: &[u8]) {
    if let Some(d) = data.get_mut(range) {
        if d.len() == bytes.len() {
            d.copy_from_slice(bytes);
        }
    }
}

fn byte(data: &[u8], at: usize) -> u8 {
    data.get(at).copied().unwrap_or(0)
}

fn put_byte(data: &mut [u8], at: usize, v: u8) {
    if let Some(b) = data.get_mut(at) {
        *b = v;
    }
}

/// Why a hello or a frame header does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not this format's magic number.
    #[error("bad magic number {0:02x?}")]
    Magic([u8; 4]),
    /// Another version of the format.
    #[error("unsupported version {0}")]
    Version(u8),
    /// Reserved bits or bytes that are not zero.
    #[error("reserved bits set")]
    Reserved,
}

/// A parsed hello: who connects, for which hop, with which FIFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloRepr {
    /// `token_hash` of the job token.
    pub token_hash: u64,
    /// The connecting (sending) rank.
    pub sender: u32,
    /// The rank it means to reach.
    pub receiver: u32,
    /// The channel of the hop.
    pub channel: u8,
    /// The sender's FIFO slot size.
    pub slot_bytes: u64,
    /// The sender's slots per slice.
    pub slots_per_slice: u64,
}

impl HelloRepr {
    /// Parses a hello (total: any 40 bytes give a value or an error).
    pub fn parse(b: &[u8; HELLO_LEN]) -> Result<HelloRepr, WireError> {
        use field::hello as f;
        let magic = get(b, f::MAGIC);
        if magic != HELLO_MAGIC {
            return Err(WireError::Magic(magic));
        }
        if byte(b, f::VERSION) != VERSION {
            return Err(WireError::Version(byte(b, f::VERSION)));
        }
        if get::<2>(b, f::RESERVED) != [0; 2] {
            return Err(WireError::Reserved);
        }
        Ok(HelloRepr {
            token_hash: u64::from_be_bytes(get(b, f::TOKEN)),
            sender: u32::from_be_bytes(get(b, f::SENDER)),
            receiver: u32::from_be_bytes(get(b, f::RECEIVER)),
            channel: byte(b, f::CHANNEL),
            slot_bytes: u64::from_be_bytes(get(b, f::SLOT_BYTES)),
            slots_per_slice: u64::from_be_bytes(get(b, f::SLOTS_PER_SLICE)),
        })
    }

    /// The hello as bytes.
    pub fn emit(&self) -> [u8; HELLO_LEN] {
        use field::hello as f;
        let mut b = [0u8; HELLO_LEN];
        put(&mut b, f::MAGIC, &HELLO_MAGIC);
        put_byte(&mut b, f::VERSION, VERSION);
        put_byte(&mut b, f::CHANNEL, self.channel);
        put(&mut b, f::TOKEN, &self.token_hash.to_be_bytes());
        put(&mut b, f::SENDER, &self.sender.to_be_bytes());
        put(&mut b, f::RECEIVER, &self.receiver.to_be_bytes());
        put(&mut b, f::SLOT_BYTES, &self.slot_bytes.to_be_bytes());
        put(
            &mut b,
            f::SLOTS_PER_SLICE,
            &self.slots_per_slice.to_be_bytes(),
        );
        b
    }
}

/// Why a receiver refused a hello (the reply's second byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Accepted (the code of an `'A'` reply).
    None,
    /// Not a hello of this format or version.
    BadHello,
    /// Another job's token.
    WrongToken,
    /// The hello names another receiving rank.
    WrongReceiver,
    /// No hop from that sender on that channel was listened for.
    UnknownHop,
    /// The sender's FIFO geometry is not the receiver's.
    Geometry,
    /// The hop is connected already.
    Duplicate,
    /// A code this version does not know.
    Unknown(u8),
}

impl Reason {
    /// The reason's code.
    pub fn code(self) -> u8 {
        match self {
            Reason::None => 0,
            Reason::BadHello => 1,
            Reason::WrongToken => 2,
            Reason::WrongReceiver => 3,
            Reason::UnknownHop => 4,
            Reason::Geometry => 5,
            Reason::Duplicate => 6,
            Reason::Unknown(c) => c,
        }
    }

    /// The reason of `code` (total).
    pub fn from_code(code: u8) -> Reason {
        match code {
            0 => Reason::None,
            1 => Reason::BadHello,
            2 => Reason::WrongToken,
            3 => Reason::WrongReceiver,
            4 => Reason::UnknownHop,
            5 => Reason::Geometry,
            6 => Reason::Duplicate,
            c => Reason::Unknown(c),
        }
    }

    /// In words, for errors and logs.
    pub fn describe(self) -> String {
        match self {
            Reason::None => "no reason".into(),
            Reason::BadHello => "not a ringcc tcp hello of this version".into(),
            Reason::WrongToken => "another job's token".into(),
            Reason::WrongReceiver => "a hello for another rank".into(),
            Reason::UnknownHop => "no such hop was listened for".into(),
            Reason::Geometry => "another FIFO geometry".into(),
            Reason::Duplicate => "the hop is connected already".into(),
            Reason::Unknown(c) => format!("unknown reason code {c}"),
        }
    }
}

/// The receiver's answer to a hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The hop is connected; frames may follow.
    Accepted,
    /// Refused; the receiver closes the connection.
    Refused(Reason),
    /// Not a reply of this format (the verdict byte).
    Unknown(u8),
}

impl Reply {
    /// Parses a reply (total).
    pub fn parse(b: &[u8; REPLY_LEN]) -> Reply {
        match (byte(b, 0), byte(b, 1)) {
            (ACCEPTED, _) => Reply::Accepted,
            (REFUSED, r) => Reply::Refused(Reason::from_code(r)),
            (v, _) => Reply::Unknown(v),
        }
    }

    /// The reply as bytes.
    pub fn emit(self) -> [u8; REPLY_LEN] {
        match self {
            Reply::Accepted => [ACCEPTED, 0],
            Reply::Refused(r) => [REFUSED, r.code()],
            Reply::Unknown(v) => [v, 0],
        }
    }
}

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A call header ([`CALL_HEADER_LEN`](ringcc_core::wire::call_header::CALL_HEADER_LEN)
    /// bytes) for the data at `step`.
    CallHeader,
    /// A slot's bytes for `step`.
    Data,
    /// The receiver's new `head` in `step` (no payload).
    Credit,
    /// The end was closed in order (no payload): nothing more comes this
    /// way. A connection that ends without one was lost (a crash).
    Goodbye,
    /// A code this version does not know.
    Unknown(u8),
}

impl Kind {
    /// The kind's code.
    pub fn code(self) -> u8 {
        match self {
            Kind::CallHeader => 1,
            Kind::Data => 2,
            Kind::Credit => 3,
            Kind::Goodbye => 4,
            Kind::Unknown(c) => c,
        }
    }

    /// The kind of `code` (total).
    pub fn from_code(code: u8) -> Kind {
        match code {
            1 => Kind::CallHeader,
            2 => Kind::Data,
            3 => Kind::Credit,
            4 => Kind::Goodbye,
            c => Kind::Unknown(c),
        }
    }
}

/// A parsed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRepr {
    /// What the frame carries.
    pub kind: Kind,
    /// The slice's last data frame: publishes `tail = step + 1`.
    pub last: bool,
    /// Payload bytes after the header.
    pub length: u32,
    /// The call sequence number.
    pub seq: u64,
    /// The FIFO step (a credit frame: the new head).
    pub step: u64,
}

impl FrameRepr {
    /// A credit frame for `head`.
    pub fn credit(head: u64) -> FrameRepr {
        FrameRepr {
            kind: Kind::Credit,
            last: false,
            length: 0,
            seq: 0,
            step: head,
        }
    }

    /// A goodbye frame, sent at `step` (the next step, or the head).
    pub fn goodbye(step: u64) -> FrameRepr {
        FrameRepr {
            kind: Kind::Goodbye,
            last: false,
            length: 0,
            seq: 0,
            step,
        }
    }

    /// Parses a frame header (total). An unknown kind parses; what a kind
    /// may carry is the reader's check.
    pub fn parse(b: &[u8; FRAME_LEN]) -> Result<FrameRepr, WireError> {
        use field::frame as f;
        let magic = get(b, f::MAGIC);
        if magic != FRAME_MAGIC {
            return Err(WireError::Magic(magic));
        }
        if byte(b, f::VERSION) != VERSION {
            return Err(WireError::Version(byte(b, f::VERSION)));
        }
        let flags = byte(b, f::FLAGS);
        if flags & !FLAG_LAST != 0
            || byte(b, f::RESERVED_A) != 0
            || get::<4>(b, f::RESERVED_B) != [0; 4]
        {
            return Err(WireError::Reserved);
        }
        Ok(FrameRepr {
            kind: Kind::from_code(byte(b, f::KIND)),
            last: flags & FLAG_LAST != 0,
            length: u32::from_be_bytes(get(b, f::LENGTH)),
            seq: u64::from_be_bytes(get(b, f::SEQ)),
            step: u64::from_be_bytes(get(b, f::STEP)),
        })
    }

    /// Writes the header into the first [`FRAME_LEN`] bytes of `out`
    /// (nothing when `out` is shorter).
    pub fn emit_into(&self, out: &mut [u8]) {
        use field::frame as f;
        let Some(b) = out.get_mut(..FRAME_LEN) else {
            return;
        };
        put(b, f::MAGIC, &FRAME_MAGIC);
        put_byte(b, f::VERSION, VERSION);
        put_byte(b, f::KIND, self.kind.code());
        put_byte(b, f::FLAGS, if self.last { FLAG_LAST } else { 0 });
        put_byte(b, f::RESERVED_A, 0);
        put(b, f::LENGTH, &self.length.to_be_bytes());
        put(b, f::RESERVED_B, &[0; 4]);
        put(b, f::SEQ, &self.seq.to_be_bytes());
        put(b, f::STEP, &self.step.to_be_bytes());
    }

    /// The header as bytes.
    pub fn emit(&self) -> [u8; FRAME_LEN] {
        let mut b = [0u8; FRAME_LEN];
        self.emit_into(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hello_fixture() {
        let h = HelloRepr {
            token_hash: 0x0102_0304_0506_0708,
            sender: 3,
            receiver: 4,
            channel: 5,
            slot_bytes: 4096,
            slots_per_slice: 2,
        };
        let b = h.emit();
        assert_eq!(&b[0..8], b"RCTH\x01\x05\x00\x00");
        assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[16..24], &[0, 0, 0, 3, 0, 0, 0, 4]);
        assert_eq!(
            &b[24..40],
            &[0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        assert_eq!(HelloRepr::parse(&b), Ok(h));
    }

    #[test]
    fn frame_fixture() {
        let f = FrameRepr {
            kind: Kind::Data,
            last: true,
            length: 0x0102,
            seq: 7,
            step: 9,
        };
        let b = f.emit();
        assert_eq!(&b[0..8], b"RCTF\x01\x02\x01\x00");
        assert_eq!(&b[8..16], &[0, 0, 1, 2, 0, 0, 0, 0]);
        assert_eq!(
            &b[16..32],
            &[0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 9]
        );
        assert_eq!(FrameRepr::parse(&b), Ok(f));
        let mut bad = b;
        bad[6] = 2;
        assert_eq!(FrameRepr::parse(&bad), Err(WireError::Reserved));
        bad = b;
        bad[4] = 2;
        assert_eq!(FrameRepr::parse(&bad), Err(WireError::Version(2)));
    }

    #[test]
    fn replies_and_codes_round_trip() {
        for c in 0..=255u8 {
            assert_eq!(Reason::from_code(c).code(), c);
            assert_eq!(Kind::from_code(c).code(), c);
        }
        assert_eq!(Reply::parse(&Reply::Accepted.emit()), Reply::Accepted);
        let r = Reply::Refused(Reason::Geometry);
        assert_eq!(Reply::parse(&r.emit()), r);
        assert_eq!(Reply::parse(&[0, 0]), Reply::Unknown(0));
    }

    proptest! {
        #[test]
        fn parse_is_total(h in any::<[u8; HELLO_LEN]>(), f in any::<[u8; FRAME_LEN]>(), r in any::<[u8; 2]>()) {
            let _ = HelloRepr::parse(&h);
            let _ = FrameRepr::parse(&f);
            let _ = Reply::parse(&r);
        }

        #[test]
        fn frame_round_trips(kind in any::<u8>(), last in any::<bool>(), length in any::<u32>(), seq in any::<u64>(), step in any::<u64>()) {
            let f = FrameRepr { kind: Kind::from_code(kind), last, length, seq, step };
            prop_assert_eq!(FrameRepr::parse(&f.emit()), Ok(f));
        }

        #[test]
        fn hello_round_trips(token_hash in any::<u64>(), sender in any::<u32>(), receiver in any::<u32>(), channel in any::<u8>(), slot_bytes in any::<u64>(), slots_per_slice in any::<u64>()) {
            let h = HelloRepr { token_hash, sender, receiver, channel, slot_bytes, slots_per_slice };
            prop_assert_eq!(HelloRepr::parse(&h.emit()), Ok(h));
        }
    }
}
