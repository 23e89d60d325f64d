//! Links the whole core into a freestanding binary: plans an AllReduce,
//! drives one state machine, reduces a buffer, formats nothing on a heap —
//! all with no std, no alloc and no allocator.

#![no_std]
#![no_main]
// The memory functions below must not be "optimized" into calls to
// themselves.
#![no_builtins]

use core::panic::PanicInfo;
use ringcc_core::fifo::FifoGeometry;
use ringcc_core::prim::{Action, LinkState, Machine};
use ringcc_core::reduce::{reduce_in_place, DataType, ReduceOp};
use ringcc_core::topology::Topology;
use ringcc_core::{CallDesc, ChannelId, Collective, Plan, Rank};

#[panic_handler]
fn panic(_: &PanicInfo) -> ! {
    loop {
        core::hint::spin_loop();
    }
}

fn work() -> u64 {
    let topo = match Topology::<16>::uniform(2, 4, 2) {
        Ok(t) => t,
        Err(_) => return 1,
    };
    let Ok(ring) = topo.ring(ChannelId(1)) else {
        return 2;
    };
    let Ok(plan) = Plan::new(Collective::AllReduce, 1000, DataType::F32, 8, 2, 1024) else {
        return 3;
    };
    let call = CallDesc::new(0, Collective::AllReduce, 1000, DataType::F32, ReduceOp::Sum);
    let Ok(steps) = plan.steps(ChannelId(1), Rank(3), ring) else {
        return 4;
    };
    let Ok(mut m) = Machine::new(call, steps, FifoGeometry::NCCL, LinkState::default()) else {
        return 5;
    };
    let mut acc = [1u8; 64];
    let src = [2u8; 64];
    if reduce_in_place(DataType::U8, ReduceOp::Sum, &mut acc, &src).is_err() {
        return 6;
    }
    match m.poll_action() {
        Ok(Some(Action::Exec(e))) => e.count.wrapping_add(u64::from(acc[0])),
        _ => 7,
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
