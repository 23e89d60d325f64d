//! What `ringcc perf --backend cuda` runs: one collective, timed over
//! several iterations, then checked (nccl-tests' `time algbw busbw
//! #wrong`).
//!
//! The check is the core's [`verify`](ringcc_core::verify), as on every
//! other backend: each rank's input is [`fill_input`], each output read
//! back from device memory is compared with the reference by
//! [`count_wrong`]. The test-only fault ([`verify_corrupted`]) corrupts
//! elements of one rank's output *in device memory* before it is read
//! back, so the comparison has to find them.
//!
//! The same code runs on the GPU ([`Comm`]) and on the host fake device
//! ([`HostComm`]): both are a [`PerfComm`].

use std::time::Instant;

use cudarc::driver::CudaSlice;
use ringcc_core::verify::{count_wrong, fill_input};
use ringcc_core::{Call, Collective, Plan, Rank};

use crate::comm::Comm;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::host::{HostCall, HostComm};
use crate::kernel::ModuleKey;
use crate::state::{BufferPlan, CallBuffers};

/// What a buffer holds where no input was written: not a value the
/// collectives' reference gives by chance in most types, so an output
/// element never written is counted wrong.
pub const FILL: u8 = 0xA5;

/// One measurement to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerfCase {
    /// The call (count as nccl-tests counts it).
    pub call: Call,
    /// In place (one buffer per rank) or out of place.
    pub in_place: bool,
    /// Untimed iterations first.
    pub warmup: u32,
    /// Timed iterations.
    pub iters: u32,
}

/// The result of a [`PerfCase`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerfResult {
    /// Mean time of one collective, microseconds.
    pub time_us: f64,
    /// Bytes of the collective as nccl-tests counts them (the larger
    /// buffer of a rank).
    pub bytes: u64,
    /// `bytes / time`, GB/s.
    pub algbw: f64,
    /// `algbw × bus factor`, GB/s.
    pub busbw: f64,
    /// Elements that differ from the core's reference, over all ranks.
    pub wrong: u64,
}

/// A communicator `perf` can time and check: the GPU's [`Comm`] or the
/// host fake device's [`HostComm`].
pub trait PerfComm {
    /// Every rank's device buffers for one case.
    type Buffers;
    /// Ranks.
    fn ranks(&self) -> u32;
    /// The settings (plans, buffer sizes).
    fn config(&self) -> Config;
    /// The sequence number of the next call: the salt of fresh inputs.
    fn next_seq(&self) -> u64;
    /// Gets what `call` needs (its kernels) ready before it is timed.
    fn prepare(&mut self, call: &Call) -> Result<()>;
    /// Device buffers for `case`, rank `r`'s input holding `inputs[r]`
    /// where [`placement`] puts it, every other byte [`FILL`].
    fn alloc(&mut self, case: &PerfCase, inputs: &[Vec<u8>]) -> Result<Self::Buffers>;
    /// Enqueues the case's call on every rank.
    fn launch(&mut self, case: &PerfCase, b: &mut Self::Buffers) -> Result<()>;
    /// Waits until everything enqueued has run.
    fn synchronize(&mut self) -> Result<()>;
    /// `len` bytes at byte `offset` of rank `rank`'s output (the bytes
    /// the collective writes), read back from device memory.
    fn read_output(
        &mut self,
        case: &PerfCase,
        b: &Self::Buffers,
        rank: Rank,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>>;
    /// Writes `data` into device memory at byte `offset` of rank `rank`'s
    /// output.
    fn write_output(
        &mut self,
        case: &PerfCase,
        b: &mut Self::Buffers,
        rank: Rank,
        offset: u64,
        data: &[u8],
    ) -> Result<()>;
}

/// Where rank `rank`'s input and output lie for `case`: in one buffer of
/// `total` bytes in place; out of place the input is the whole send
/// buffer and the output the whole receive buffer (`total` bytes).
pub fn placement(case: &PerfCase, ranks: u32, config: &Config, rank: Rank) -> Result<BufferPlan> {
    if case.in_place {
        return case.call.in_place(ranks, rank, config);
    }
    let (ib, ob) = case.call.bytes(ranks, config)?;
    Ok(BufferPlan {
        input: (0, ib),
        output: (0, ob),
        total: ob,
    })
}

/// The rank whose output the test-only fault corrupts: one whose output
/// is defined (Reduce's root, else rank 0).
pub fn victim(call: &Call) -> Rank {
    match call.collective {
        Collective::Reduce { root } => root,
        _ => Rank(0),
    }
}

/// Every rank's input for `plan`, from the core's generator.
fn inputs(plan: &Plan, call: &Call, salt: u64) -> Result<Vec<Vec<u8>>> {
    let bytes = plan
        .input_len()
        .saturating_mul(u64::from(call.dtype.size()));
    let bytes = usize::try_from(bytes).map_err(|_| Error::BadConfig {
        what: "input larger than the address space",
    })?;
    (0..plan.ranks())
        .map(|r| {
            let mut v = vec![0u8; bytes];
            fill_input(plan, call.op, r, salt, &mut v)
                .map_err(Error::core("verify::fill_input"))?;
            Ok(v)
        })
        .collect()
}

/// Runs `case` once on fresh inputs and counts the elements that differ
/// from the core's reference, over all ranks (nccl-tests' `#wrong`).
pub fn verify<C: PerfComm>(comm: &mut C, case: &PerfCase) -> Result<u64> {
    verify_corrupted(comm, case, 0)
}

/// [`verify`], with a test-only fault: once the call has run, the first
/// `corrupt` elements of the [`victim`]'s output (as many as it has) get a
/// byte flipped in device memory, before every output is read back and
/// compared. The count includes them.
pub fn verify_corrupted<C: PerfComm>(comm: &mut C, case: &PerfCase, corrupt: u64) -> Result<u64> {
    let call = case.call;
    let n = comm.ranks();
    let config = comm.config();
    let plan = call.plan_with(n, &config)?;
    let salt = comm.next_seq();
    let inputs = inputs(&plan, &call, salt)?;
    let mut b = comm.alloc(case, &inputs)?;
    comm.launch(case, &mut b)?;
    comm.synchronize()?;
    let elem = u64::from(call.dtype.size());
    if corrupt > 0 {
        let v = victim(&call);
        let len = corrupt
            .min(placement(case, n, &config, v)?.output.1 / elem)
            .saturating_mul(elem);
        let mut out = comm.read_output(case, &b, v, 0, len)?;
        for e in out.chunks_exact_mut(usize::from(call.dtype.size())) {
            e[0] ^= 0x5a;
        }
        comm.write_output(case, &mut b, v, 0, &out)?;
    }
    let mut wrong = 0u64;
    for r in (0..n).map(Rank) {
        if matches!(call.collective, Collective::Reduce { root } if root != r) {
            // Undefined output: nothing to read back.
            continue;
        }
        let len = placement(case, n, &config, r)?.output.1;
        let out = comm.read_output(case, &b, r, 0, len)?;
        let w = count_wrong(&plan, call.op, r.0, salt, &out)
            .map_err(Error::core("verify::count_wrong"))?;
        wrong = wrong.saturating_add(w);
    }
    Ok(wrong)
}

/// Runs `case` on `comm`: warm-up, timed iterations (host clock around
/// enqueue and synchronize, as nccl-tests), then one checked run on fresh
/// inputs ([`verify`]).
pub fn run<C: PerfComm>(comm: &mut C, case: &PerfCase) -> Result<PerfResult> {
    let call = case.call;
    let n = comm.ranks();
    let config = comm.config();
    comm.prepare(&call)?;
    let plan = call.plan_with(n, &config)?;
    let mut b = comm.alloc(case, &inputs(&plan, &call, comm.next_seq())?)?;
    for _ in 0..case.warmup {
        comm.launch(case, &mut b)?;
    }
    comm.synchronize()?;
    let started = Instant::now();
    for _ in 0..case.iters {
        comm.launch(case, &mut b)?;
    }
    comm.synchronize()?;
    let secs = started.elapsed().as_secs_f64() / f64::from(case.iters.max(1));
    drop(b);
    let wrong = verify(comm, case)?;
    let (ib, ob) = call.bytes(n, &config)?;
    let bytes = ib.max(ob);
    let algbw = bytes as f64 / secs / 1e9;
    Ok(PerfResult {
        time_us: secs * 1e6,
        bytes,
        algbw,
        busbw: algbw * call.collective.bus_factor(n),
        wrong,
    })
}

/// Rank `r`'s buffer for `case`: `FILL`, with `input` where it goes.
fn host_buffer(p: &BufferPlan, input: &[u8], in_place: bool) -> Vec<u8> {
    if !in_place {
        return input.to_vec();
    }
    let mut host = vec![FILL; p.total as usize];
    let at = p.input.0 as usize;
    if let Some(dst) = host.get_mut(at..at + input.len()) {
        dst.copy_from_slice(input);
    }
    host
}

/// The bytes `offset..offset + len` of the output, in its buffer.
fn output_range(p: &BufferPlan, offset: u64, len: u64) -> Result<std::ops::Range<usize>> {
    match offset.checked_add(len) {
        Some(end) if end <= p.output.1 => {
            let at = |x: u64| usize::try_from(p.output.0 + x).unwrap_or(usize::MAX);
            Ok(at(offset)..at(end))
        }
        _ => Err(Error::OutOfBounds {
            buffer: "output".into(),
            offset,
            len,
            capacity: p.output.1,
        }),
    }
}

/// The GPU communicator's buffers of one case.
#[derive(Debug)]
pub struct GpuBuffers {
    send: Vec<CudaSlice<u8>>,
    recv: Vec<CudaSlice<u8>>,
}

impl PerfComm for Comm {
    type Buffers = GpuBuffers;

    fn ranks(&self) -> u32 {
        Comm::ranks(self)
    }

    fn config(&self) -> Config {
        *Comm::config(self)
    }

    fn next_seq(&self) -> u64 {
        self.state.seq()
    }

    fn prepare(&mut self, call: &Call) -> Result<()> {
        // The module the progress loop launches: the call's type and op.
        self.device.prepare(ModuleKey {
            dtype: call.dtype,
            op: call.op,
        })
    }

    fn alloc(&mut self, case: &PerfCase, inputs: &[Vec<u8>]) -> Result<GpuBuffers> {
        let n = Comm::ranks(self);
        let config = *Comm::config(self);
        let mut b = GpuBuffers {
            send: Vec::new(),
            recv: Vec::new(),
        };
        for (r, input) in (0..n).map(Rank).zip(inputs) {
            let p = placement(case, n, &config, r)?;
            let s = self.stream(r)?;
            let host = host_buffer(&p, input, case.in_place);
            if case.in_place {
                b.recv
                    .push(s.clone_htod(&host).map_err(Error::driver("cuMemcpyHtoD"))?);
            } else {
                b.send
                    .push(s.clone_htod(&host).map_err(Error::driver("cuMemcpyHtoD"))?);
                let out = vec![FILL; p.total.max(1) as usize];
                b.recv
                    .push(s.clone_htod(&out).map_err(Error::driver("cuMemcpyHtoD"))?);
            }
        }
        Ok(b)
    }

    fn launch(&mut self, case: &PerfCase, b: &mut GpuBuffers) -> Result<()> {
        let mut g = self.group();
        if case.in_place {
            for (r, buf) in b.recv.iter_mut().enumerate() {
                g.raw_in_place(Rank(r as u32), case.call, buf)?;
            }
        } else {
            for (r, (s, d)) in b.send.iter().zip(b.recv.iter_mut()).enumerate() {
                g.raw(Rank(r as u32), case.call, s, d)?;
            }
        }
        g.launch()
    }

    fn synchronize(&mut self) -> Result<()> {
        Comm::synchronize(self)
    }

    fn read_output(
        &mut self,
        case: &PerfCase,
        b: &GpuBuffers,
        rank: Rank,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        let p = placement(case, Comm::ranks(self), Comm::config(self), rank)?;
        let range = output_range(&p, offset, len)?;
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let buf = b.recv.get(rank.0 as usize).ok_or(Error::RankOutOfRange {
            rank,
            ranks: Comm::ranks(self),
        })?;
        self.stream(rank)?
            .clone_dtoh(&buf.slice(range))
            .map_err(Error::driver("cuMemcpyDtoH"))
    }

    fn write_output(
        &mut self,
        case: &PerfCase,
        b: &mut GpuBuffers,
        rank: Rank,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let p = placement(case, Comm::ranks(self), Comm::config(self), rank)?;
        let range = output_range(&p, offset, data.len() as u64)?;
        if range.is_empty() {
            return Ok(());
        }
        let ranks = Comm::ranks(self);
        let buf = b
            .recv
            .get_mut(rank.0 as usize)
            .ok_or(Error::RankOutOfRange { rank, ranks })?;
        let s = self.stream(rank)?.clone();
        s.memcpy_htod(data, &mut buf.slice_mut(range))
            .map_err(Error::driver("cuMemcpyHtoD"))?;
        s.synchronize()
            .map_err(Error::driver("cuStreamSynchronize"))
    }
}

impl PerfComm for HostComm {
    type Buffers = Vec<HostCall>;

    fn ranks(&self) -> u32 {
        self.layout().ranks()
    }

    fn config(&self) -> Config {
        *HostComm::config(self)
    }

    fn next_seq(&self) -> u64 {
        self.state().seq()
    }

    fn prepare(&mut self, _call: &Call) -> Result<()> {
        Ok(())
    }

    fn alloc(&mut self, case: &PerfCase, inputs: &[Vec<u8>]) -> Result<Vec<HostCall>> {
        let n = self.layout().ranks();
        let config = *HostComm::config(self);
        (0..n)
            .map(Rank)
            .zip(inputs)
            .map(|(r, input)| {
                let p = placement(case, n, &config, r)?;
                Ok(HostCall {
                    spec: case.call,
                    input: host_buffer(&p, input, case.in_place),
                    in_place: case.in_place,
                })
            })
            .collect()
    }

    fn launch(&mut self, _case: &PerfCase, b: &mut Vec<HostCall>) -> Result<()> {
        self.run(b).map(drop)
    }

    fn synchronize(&mut self) -> Result<()> {
        self.device_mut().synchronize()
    }

    fn read_output(
        &mut self,
        _case: &PerfCase,
        _b: &Vec<HostCall>,
        rank: Rank,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        let out = self.device().output(rank).ok_or(Error::BadConfig {
            what: "fake device lost an output buffer",
        })?;
        host_range(out.len(), offset, len).map(|r| out[r].to_vec())
    }

    fn write_output(
        &mut self,
        _case: &PerfCase,
        _b: &mut Vec<HostCall>,
        rank: Rank,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let out = self.device_mut().output_mut(rank).ok_or(Error::BadConfig {
            what: "fake device lost an output buffer",
        })?;
        let r = host_range(out.len(), offset, data.len() as u64)?;
        out[r].copy_from_slice(data);
        Ok(())
    }
}

/// `offset..offset + len` of the fake device's output of `bytes` bytes.
fn host_range(bytes: usize, offset: u64, len: u64) -> Result<std::ops::Range<usize>> {
    let whole = BufferPlan {
        input: (0, 0),
        output: (0, bytes as u64),
        total: bytes as u64,
    };
    output_range(&whole, offset, len)
}
