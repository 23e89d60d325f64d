//! `ringcc explain`: the schedule a person can check against the seed
//! documents — rings and hops per channel, then per step and rank the
//! primitive and the chunk, optionally the symbolic contents (a0+b0+…),
//! and the totals.

use std::fmt::Write as _;

use ringcc_core::cost::{self, Link};
use ringcc_core::topology::{HopKind, Ring, Topology};
use ringcc_core::{ChannelId, Collective, Plan, Primitive, Rank, RingIndex, Step};

use crate::args::ExplainArgs;
use crate::error::CliError;
use crate::topo::{self, MAX_RANKS};

/// Most ranks whose every step is printed.
const TABLE_RANKS: u32 = 16;
/// Most ranks `--values` shows (lettered a, b, …; every rank's steps are
/// printed).
const LETTERED: u32 = TABLE_RANKS;

/// Runs `ringcc explain` and returns the text to print.
pub fn explain(a: &ExplainArgs) -> Result<String, CliError> {
    let shape = topo::resolve(&a.topo)?;
    let t = topo::build(&shape)?;
    let n = t.ranks();
    let collective = a.collective.collective(a.root);
    if a.root >= n {
        return Err(CliError::usage(format!(
            "--root {} is out of range for {n} ranks",
            a.root
        )));
    }
    let channels = shape.channels();
    if u32::from(a.channel) >= channels {
        return Err(CliError::usage(format!(
            "--channel {} but only {channels} channels",
            a.channel
        )));
    }
    if a.values && n > LETTERED {
        return Err(CliError::usage(format!(
            "--values shows at most {LETTERED} ranks, not {n}"
        )));
    }
    let elem = u64::from(a.dtype.size());
    // By default one element per chunk of a loop: the smallest picture.
    let per_loop_chunks = match collective {
        Collective::AllReduce => u64::from(n),
        _ => 1,
    };
    let count = a.count.unwrap_or(per_loop_chunks * u64::from(channels));
    let chunk_bytes = if a.count.is_some() {
        shape.chunk_bytes()
    } else {
        elem
    };
    let plan =
        Plan::new(collective, count, a.dtype, n, channels, chunk_bytes).map_err(CliError::core)?;

    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "{} on {} ranks: {} node(s) x {} GPU(s), {} NIC(s) per node, {} channel(s){}",
        collective,
        n,
        shape.nodes,
        shape.gpus_per_node,
        shape.nics_per_node,
        channels,
        if shape.cross_nic { ", cross-NIC" } else { "" }
    );
    let _ = writeln!(
        w,
        "count {count} x {} ({} bytes), chunk {} bytes",
        a.dtype,
        count * elem * blocks(collective, n),
        chunk_bytes
    );
    let _ = writeln!(
        w,
        "\nRings (→ NVLink peer copy, ⇒ NIC: RDMA WRITE over a queue pair):"
    );
    for c in 0..channels.min(64) {
        let ring = t.ring(ChannelId(c as u8)).map_err(CliError::core)?;
        let _ = writeln!(w, "  channel {c:>2}: {}", ring_line(&ring, n)?);
    }
    schedule(w, a, &t, &plan)?;
    totals(w, &plan, &t, &shape)?;
    tuning(w, a, collective, count * elem * blocks(collective, n))?;
    Ok(out)
}

/// The tuner's choice for this call on the simulated cluster, and the
/// model's figures for every candidate, the chosen one marked.
fn tuning(
    w: &mut String,
    a: &ExplainArgs,
    collective: Collective,
    bytes: u64,
) -> Result<(), CliError> {
    let cfg = crate::backend::mock::config(&a.topo)?;
    let tuner = crate::backend::mock::tuner(&a.topo, &cfg)?;
    let choice = tuner.choose(collective, bytes).map_err(CliError::core)?;
    let _ = writeln!(
        w,
        "\nTuner ({} B; NCCL-style model, src/graph/tuning.cc constants; the simulator runs Ring and Tree with every protocol):",
        bytes
    );
    let _ = writeln!(
        w,
        "  {:<6} {:<7} {:>8} {:>12} {:>12} {:>12}  ",
        "algo", "proto", "channels", "latency us", "algbw GB/s", "time us"
    );
    for e in choice.table.iter().flatten() {
        let allowed = tuner.allowed(e.algorithm, e.protocol);
        let mark = if *e == choice.chosen {
            "<- chosen"
        } else if !allowed {
            "(not allowed)"
        } else {
            ""
        };
        let _ = writeln!(
            w,
            "  {:<6} {:<7} {:>8} {:>12.2} {:>12.2} {:>12.2}  {mark}",
            e.algorithm.name(),
            e.protocol.name(),
            e.channels,
            e.latency_us,
            e.algbw_gbps,
            e.time_us
        );
    }
    Ok(())
}

/// Blocks per buffer (ReduceScatter input, AllGather output hold `n`).
fn blocks(c: Collective, n: u32) -> u64 {
    match c {
        Collective::ReduceScatter | Collective::AllGather => u64::from(n),
        _ => 1,
    }
}

fn ring_line(ring: &Ring<'_, MAX_RANKS>, n: u32) -> Result<String, CliError> {
    let mut s = String::new();
    let show = n.min(33);
    for i in 0..show {
        let r = ring.rank_at(RingIndex(i)).map_err(CliError::core)?;
        let _ = write!(s, "GPU{}", r.0);
        if i + 1 == show && show < n {
            let _ = write!(s, " … ({} more)", n - show);
            break;
        }
        let _ = match ring.hop(r).map_err(CliError::core)? {
            HopKind::Loopback => write!(s, " (alone)"),
            HopKind::Intra => write!(s, " → "),
            HopKind::Inter { send_nic, recv_nic } => {
                write!(s, " ⇒NIC{}→NIC{}⇒ ", send_nic.0, recv_nic.0)
            }
        };
    }
    if n > 1 && show == n {
        let _ = write!(
            s,
            "GPU{}",
            ring.rank_at(RingIndex(0)).map_err(CliError::core)?.0
        );
    }
    Ok(s)
}

fn letter(r: u32) -> char {
    char::from(b'a' + (r % 26) as u8)
}

/// Symbolic content: the ranks whose data it combines, in order.
type Sym = Vec<u32>;

fn label(plan: &Plan, ring: &Ring<'_, MAX_RANKS>, chunk: u32, v: &Sym) -> String {
    let part = |r: u32| -> String {
        match plan.collective() {
            Collective::AllReduce => format!("{}{chunk}", letter(r)),
            Collective::ReduceScatter => {
                let block = ring.rank_at(RingIndex(chunk)).map(|b| b.0).unwrap_or(chunk);
                format!("{}{block}", letter(r))
            }
            _ => letter(r).to_string(),
        }
    };
    if v.is_empty() {
        return "-".into();
    }
    v.iter().map(|&r| part(r)).collect::<Vec<_>>().join("+")
}

// Steps, ranks and chunks index several tables at once.
#[allow(clippy::needless_range_loop)]
fn schedule(
    w: &mut String,
    a: &ExplainArgs,
    t: &Topology<MAX_RANKS>,
    plan: &Plan,
) -> Result<(), CliError> {
    let n = plan.ranks();
    let ch = ChannelId(a.channel);
    let ring = t.ring(ch).map_err(CliError::core)?;
    let spl = plan.steps_per_loop() as usize;
    let loops = plan.loops(ch).map_err(CliError::core)?;
    // Ring collectives hand a step's message to the successor's next step;
    // chains (Broadcast, Reduce) pass it down the chain within the same
    // step, so their ranks are visited in chain order.
    let chain_start = match plan.collective() {
        Collective::Broadcast { root } => Some(root.0),
        Collective::Reduce { root } => Some(ring.next(root).map_err(CliError::core)?.0),
        _ => None,
    };
    let ranks: Vec<u32> = if n > TABLE_RANKS {
        vec![0]
    } else if let Some(first) = chain_start {
        let mut v = vec![first];
        while v.len() < n as usize {
            let last = *v.last().unwrap_or(&first);
            v.push(ring.next(Rank(last)).map_err(CliError::core)?.0);
        }
        v
    } else {
        (0..n).collect()
    };
    let mut steps: Vec<Vec<Step>> = Vec::new();
    for &r in &ranks {
        let s = plan.steps(ch, Rank(r), ring).map_err(CliError::core)?;
        steps.push(s.take(spl).collect());
    }
    let _ = writeln!(
        w,
        "\nSchedule of channel {} (loop 1 of {loops}): {spl} step(s) per rank{}",
        a.channel,
        if n > TABLE_RANKS {
            format!("; rank 0 only ({n} ranks)")
        } else {
            String::new()
        }
    );
    // Symbolic state: own[r][chunk] = what rank r holds for that chunk.
    let chunks = match plan.collective() {
        Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather => n as usize,
        _ => 1,
    };
    let idx = |r: u32| ring.index_of(Rank(r)).map(|i| i.0).unwrap_or(0);
    let mut own: Vec<Vec<Sym>> = (0..n)
        .map(|r| {
            (0..chunks as u32)
                .map(|j| match plan.collective() {
                    Collective::AllGather => {
                        if j == idx(r) {
                            vec![r]
                        } else {
                            vec![]
                        }
                    }
                    Collective::Broadcast { root } => {
                        if r == root.0 {
                            vec![r]
                        } else {
                            vec![]
                        }
                    }
                    _ => vec![r],
                })
                .collect()
        })
        .collect();
    let mut in_flight: Vec<Option<(u32, Sym)>> = vec![None; n as usize];
    for s in 0..spl {
        let _ = writeln!(w, "  step {s}:");
        let mut sent: Vec<Option<(u32, Sym)>> = vec![None; n as usize];
        for (k, &r) in ranks.iter().enumerate() {
            let st = steps[k][s];
            let p = st.primitive;
            let j = st.chunk.0;
            let next = ring.next(Rank(r)).map_err(CliError::core)?.0;
            let mut line = format!(
                "    GPU{r:<3} {:<19} chunk {j:<3} {:>6} elems",
                p.name(),
                st.count
            );
            if a.values {
                let mut value = own[r as usize].get(j as usize).cloned().unwrap_or_default();
                if p.contains(Primitive::RECV) {
                    let (cj, v) = in_flight[r as usize].take().unwrap_or((j, vec![]));
                    debug_assert_eq!(cj, j);
                    value = if p.contains(Primitive::REDUCE) {
                        [v, value].concat()
                    } else {
                        v
                    };
                }
                if p.contains(Primitive::COPY) {
                    if let Some(slot) = own[r as usize].get_mut(j as usize) {
                        *slot = value.clone();
                    }
                }
                if p.contains(Primitive::SEND) {
                    let _ = write!(line, "  → GPU{next}: {}", label(plan, &ring, j, &value));
                    if chain_start.is_some() {
                        in_flight[next as usize] = Some((j, value));
                    } else {
                        sent[next as usize] = Some((j, value));
                    }
                } else if p.contains(Primitive::COPY) {
                    let _ = write!(line, "  = {}", label(plan, &ring, j, &value));
                }
            } else if p.contains(Primitive::SEND) {
                let _ = write!(line, "  → GPU{next}");
            }
            let _ = writeln!(w, "{line}");
        }
        if chain_start.is_none() {
            in_flight = sent;
        }
        if a.values && plan.collective() == Collective::AllReduce && s + 1 == n as usize {
            let _ = writeln!(
                w,
                "    -- ReduceScatter half done: every GPU owns one fully reduced chunk:"
            );
            for &r in &ranks {
                let j = idx(r);
                let _ = writeln!(
                    w,
                    "       GPU{r} owns S{j} = {}",
                    label(plan, &ring, j, &own[r as usize][j as usize])
                );
            }
        }
    }
    if a.values {
        final_state(w, plan, &ring, &own)?;
    }
    Ok(())
}

fn final_state(
    w: &mut String,
    plan: &Plan,
    ring: &Ring<'_, MAX_RANKS>,
    own: &[Vec<Sym>],
) -> Result<(), CliError> {
    let n = plan.ranks();
    let _ = writeln!(w, "\nFinal state:");
    for (r, chunks) in own.iter().enumerate() {
        let r = r as u32;
        let full = |v: &Sym| v.len() == n as usize;
        let (shown, ok) = match plan.collective() {
            Collective::AllReduce => {
                let ok = chunks.iter().all(full);
                (
                    (0..n)
                        .map(|j| format!("S{j}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    ok,
                )
            }
            Collective::ReduceScatter => {
                let j = ring.index_of(Rank(r)).map_err(CliError::core)?.0;
                (format!("block {r} = S{r}"), full(&chunks[j as usize]))
            }
            Collective::AllGather => {
                let ok = (0..n).all(|j| {
                    let owner = ring.rank_at(RingIndex(j)).map(|x| x.0).unwrap_or(j);
                    chunks[j as usize] == vec![owner]
                });
                (
                    (0..n)
                        .map(|b| format!("{}", letter(b)))
                        .collect::<Vec<_>>()
                        .join(" "),
                    ok,
                )
            }
            Collective::Broadcast { root } => {
                (format!("{}", letter(root.0)), chunks[0] == vec![root.0])
            }
            Collective::Reduce { root } => {
                if r != root.0 {
                    continue;
                }
                ("S = every rank's input reduced".into(), full(&chunks[0]))
            }
        };
        let _ = writeln!(
            w,
            "  GPU{r}: {shown} {}",
            if ok { "✓" } else { "✗ INCOMPLETE" }
        );
        if !ok {
            return Err(CliError::internal(format!(
                "the schedule left GPU{r} incomplete"
            )));
        }
    }
    Ok(())
}

fn totals(
    w: &mut String,
    plan: &Plan,
    t: &Topology<MAX_RANKS>,
    shape: &topo::Shape,
) -> Result<(), CliError> {
    let n = plan.ranks();
    let c = plan.collective();
    let elem = u64::from(plan.dtype().size());
    let size = plan.count() * elem * blocks(c, n);
    let steps = plan.steps_per_loop();
    let rounds = cost::ring_steps(c, n);
    let moved = cost::bytes_per_rank(c, size as f64, n);
    let _ = writeln!(w, "\nTotals:");
    let _ = writeln!(
        w,
        "  steps per rank per loop: {steps}   communication rounds: {rounds}"
    );
    let formula = match c {
        Collective::AllReduce => "2·S·(N−1)/N",
        Collective::ReduceScatter | Collective::AllGather => "S·(N−1)/N",
        _ => "S",
    };
    let _ = writeln!(
        w,
        "  bytes sent per rank: {formula} = {moved:.0} B for S = {size} B, N = {n}"
    );
    // The alpha-beta estimate on the slowest link the rings use.
    let link = if t.nodes() > 1 {
        Link {
            latency: Link::NIC_400G.latency,
            bandwidth: shape.nic_gbits * 1e9 / 8.0
                * f64::from(shape.channels().min(u32::from(shape.nics_per_node)).max(1)),
        }
    } else {
        Link {
            latency: Link::NVLINK.latency,
            bandwidth: shape.nvlink_gbps * 1e9,
        }
    };
    let time = cost::ring_time(c, size as f64, n, link);
    let _ = writeln!(
        w,
        "  alpha-beta estimate: {:.3} us ({} latency + {:.0} B at {:.1} GB/s per rank)",
        time * 1e6,
        rounds,
        moved,
        link.bandwidth / 1e9
    );
    Ok(())
}
