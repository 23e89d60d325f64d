//! The seed documents' walk-through: 4 GPUs in a ring 0 → 1 → 2 → 3 → 0,
//! each holding 4 chunks (GPU r holds the value r+1 everywhere), run as a
//! ring AllReduce through the core's state machines by the in-memory
//! executor. Prints, round by round, what every rank does and what each
//! chunk holds symbolically (a0+b0+…), then the numeric result.
//!
//! `cargo run -p ringcc-tests --example seed_allreduce`

#![allow(clippy::needless_range_loop)] // ranks and steps are indices into several tables at once

use ringcc_core::{ChannelId, Collective, DataType, InOrderRing, Plan, Primitive, Rank, ReduceOp};
use ringcc_tests::exec::{run, Call, Config};

const N: u32 = 4;

fn main() {
    // One element per chunk keeps the picture small: chunk j = element j.
    let count = u64::from(N);
    let plan = Plan::new(Collective::AllReduce, count, DataType::F32, N, 1, 4).expect("plan");
    let ring = InOrderRing { ranks: N };
    let steps: Vec<Vec<_>> = (0..N)
        .map(|r| {
            plan.steps(ChannelId(0), Rank(r), ring)
                .expect("steps")
                .collect()
        })
        .collect();

    // Symbolic contents: sym[r][j] is what rank r holds for chunk j, as the
    // set of contributions (a = rank 0, b = rank 1, …).
    let letter = |r: u32| (b'a' + r as u8) as char;
    let mut sym: Vec<Vec<Vec<u32>>> = (0..N).map(|r| (0..N).map(|_| vec![r]).collect()).collect();
    let show = |v: &[u32], j: usize| {
        v.iter()
            .map(|&r| format!("{}{}", letter(r), j))
            .collect::<Vec<_>>()
            .join("+")
    };
    println!("Ring AllReduce, {N} ranks, ring GPU0 → GPU1 → GPU2 → GPU3 → GPU0; GPU r holds chunks [x0, x1, x2, x3] with x = a, b, c, d");
    println!(
        "{} steps per rank (2N−1), {} communication rounds (2(N−1))\n",
        2 * N - 1,
        2 * (N - 1)
    );
    let mut in_flight: Vec<Option<(usize, Vec<u32>)>> = vec![None; N as usize];
    for s in 0..(2 * N - 1) as usize {
        println!("step {s}:");
        let mut sent: Vec<Option<(usize, Vec<u32>)>> = vec![None; N as usize];
        for r in 0..N as usize {
            let st = &steps[r][s];
            let j = st.chunk.0 as usize;
            let p = st.primitive;
            let mut value = sym[r][j].clone();
            if p.contains(Primitive::RECV) {
                let (cj, v) = in_flight[r].take().expect("data from predecessor");
                assert_eq!(cj, j, "predecessor sent another chunk");
                value = if p.contains(Primitive::REDUCE) {
                    let mut v = v;
                    v.extend(&sym[r][j]);
                    v
                } else {
                    v
                };
            }
            if p.contains(Primitive::COPY) || p.contains(Primitive::REDUCE) {
                sym[r][j] = value.clone();
            }
            let what = if p.contains(Primitive::SEND) {
                format!(" → GPU{}: {}", (r + 1) % N as usize, show(&value, j))
            } else {
                String::new()
            };
            println!("  GPU{r} {:<19} chunk {j}{what}", p.name());
            if p.contains(Primitive::SEND) {
                sent[(r + 1) % N as usize] = Some((j, value));
            }
        }
        in_flight = sent;
        if s as u32 == N - 1 {
            println!("  -- ReduceScatter done: each GPU owns one fully reduced chunk:");
            for r in 0..N as usize {
                let owned = (0..N as usize)
                    .find(|&j| sym[r][j].len() == N as usize)
                    .expect("owned chunk");
                println!("     GPU{r}: S{owned} = {}", show(&sym[r][owned], owned));
            }
        }
    }
    println!("\nfinal:");
    for r in 0..N as usize {
        let all = (0..N as usize).all(|j| sym[r][j].len() == N as usize);
        println!(
            "  GPU{r}: [{}] {}",
            (0..N)
                .map(|j| format!("S{j}"))
                .collect::<Vec<_>>()
                .join(", "),
            if all { "✓" } else { "✗" }
        );
    }

    // The same schedule with numbers, through the state machines.
    let inputs: Vec<Vec<u8>> = (0..N)
        .map(|r| {
            (0..count)
                .flat_map(|_| ((r + 1) as f32).to_ne_bytes())
                .collect()
        })
        .collect();
    let call = Call {
        collective: Collective::AllReduce,
        count,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    };
    let report = run(&Config::single_node(N), &vec![call; N as usize], &inputs);
    println!(
        "\nthrough the state machines ({} execs, {} events):",
        report.execs, report.events
    );
    for (r, out) in report.outputs.iter().enumerate() {
        let vals: Vec<f32> = out
            .as_ref()
            .expect("rank finished")
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        println!("  GPU{r}: {vals:?}");
    }
}
