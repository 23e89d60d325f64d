//! Links the whole core into a freestanding binary: plans an AllReduce,
//! drives it to completion on two ranks through the progress engine (array
//! storage: no allocation), reduces a buffer, formats nothing on a heap —
//! all with no std, no alloc and no allocator.

#![no_std]
#![no_main]
// The memory functions below must not be "optimized" into calls to
// themselves.
#![no_builtins]

use core::panic::PanicInfo;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::Action;
use ringcc_core::progress::{ArrayEngine, Channel};
use ringcc_core::reduce::{reduce_in_place, DataType, ReduceOp};
use ringcc_core::topology::{Ring, Topology};
use ringcc_core::{Call, ChannelId, Engine, Event, Rank};

#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    loop {
        core::hint::spin_loop();
    }
}

/// Channels of the call (the engines' capacity).
const CHANNELS: usize = 2;

type RankEngine<'t> = ArrayEngine<Ring<'t, 16>, CHANNELS>;

/// Carries out `action` of rank `r` on channel `c`: the exec completes at
/// once and its header and tail reach the other rank (in a two-rank ring
/// it is both successor and predecessor); a credit reaches it as a head.
fn act(
    engines: &mut [RankEngine<'_>; 2],
    now: u64,
    r: usize,
    c: ChannelId,
    action: Action,
) -> Result<(), u64> {
    let (me, other) = match engines {
        [a, b] if r == 0 => (a, b),
        [a, b] => (b, a),
    };
    match action {
        Action::Exec(e) => {
            me.handle(now, c, Event::ExecDone).map_err(|_| 20u64)?;
            for event in e.successor_events() {
                other.handle(now, c, event).map_err(|_| 21u64)?;
            }
        }
        Action::ReturnCredit { head } => {
            other.handle(now, c, Event::Head(head)).map_err(|_| 22u64)?;
        }
        Action::Done => {}
    }
    Ok(())
}

/// Both ranks of a two-rank AllReduce over two channels, to the end:
/// the number of actions carried out, or an error code.
fn drive() -> Result<u64, u64> {
    let topo = Topology::<16>::uniform(1, 2, 1).map_err(|_| 10u64)?;
    let ring0 = topo.ring(ChannelId(0)).map_err(|_| 11u64)?;
    let ring = |c| topo.ring(c).unwrap_or(ring0);
    let call = Call::all_reduce(1000, DataType::F32, ReduceOp::Sum);
    let plan = call.plan(2, CHANNELS as u32, 1024).map_err(|_| 12u64)?;
    let mut engines: [RankEngine<'_>; 2] = [
        Engine::new(Rank(0), [Channel::new(), Channel::new()], 1_000),
        Engine::new(Rank(1), [Channel::new(), Channel::new()], 1_000),
    ];
    for e in engines.iter_mut() {
        e.start(0, &call, &plan, FifoGeometry::NCCL, ring)
            .map_err(|_| 13u64)?;
    }
    let mut actions = 0u64;
    let mut now = 0u64;
    while engines.iter().any(|e| !e.is_idle()) {
        now = now.wrapping_add(1);
        let mut progressed = false;
        for r in 0..2 {
            let polled = engines.get_mut(r).map(Engine::poll);
            if let Some(Ok(Some((c, action)))) = polled {
                progressed = true;
                actions = actions.wrapping_add(1);
                act(&mut engines, now, r, c, action)?;
            } else if let Some(Err(_)) = polled {
                return Err(14);
            }
        }
        if !progressed {
            // Nothing to do and nothing in flight: the engines' deadline
            // ends it with a stall report.
            for e in engines.iter_mut() {
                if e.handle_timeout(now).is_err() {
                    return Err(15);
                }
            }
        }
    }
    Ok(actions)
}

fn work() -> u64 {
    let mut acc = [1u8; 64];
    let src = [2u8; 64];
    if reduce_in_place(DataType::U8, ReduceOp::Sum, &mut acc, &src).is_err() {
        return 6;
    }
    match drive() {
        Ok(actions) => actions.wrapping_add(u64::from(acc[0])),
        Err(code) => code,
    }
}

/// The entry point (no C runtime).
// SAFETY: `_start` is the only symbol of that name in this binary: the C
// runtime's is left out by `-nostartfiles` (build.rs).
#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    let v = core::hint::black_box(work());
    core::hint::black_box(v);
    loop {
        core::hint::spin_loop();
    }
}

// What a firmware image provides itself: no C library here.

/// `memcpy` for the freestanding image.
///
/// # Safety
/// exported under the C name the compiler emits calls to; the
/// caller guarantees `n` valid, non-overlapping bytes at both pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n, within both regions by the caller's contract.
        unsafe { *dest.add(i) = *src.add(i) };
        i += 1;
    }
    dest
}

/// `memmove` for the freestanding image.
///
/// # Safety
/// as `memcpy`; overlapping regions are copied in the safe direction.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize) <= (src as usize) {
        // SAFETY: forward copy is correct when dest precedes src.
        return unsafe { memcpy(dest, src, n) };
    }
    let mut i = n;
    while i > 0 {
        i -= 1;
        // SAFETY: i < n, within both regions by the caller's contract.
        unsafe { *dest.add(i) = *src.add(i) };
    }
    dest
}

/// `memset` for the freestanding image.
///
/// # Safety
/// the caller guarantees `n` writable bytes at `dest`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n, within the region by the caller's contract.
        unsafe { *dest.add(i) = c as u8 };
        i += 1;
    }
    dest
}

/// `memcmp` / `bcmp` for the freestanding image.
///
/// # Safety
/// the caller guarantees `n` readable bytes at both pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n, within both regions by the caller's contract.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// `bcmp`, which LLVM emits for equality-only comparisons.
///
/// # Safety
/// as `memcmp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as memcmp.
    unsafe { memcmp(a, b, n) }
}

/// The precompiled `core` carries unwinding tables that name this symbol;
/// with `panic = "abort"` nothing ever unwinds, so it is never called.
// SAFETY: a plain function under the name the unwinding tables reference.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}
