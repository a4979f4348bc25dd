//! What the device-rank layer's planning costs one process per call at cluster scale, on
//! simulated groups (no MPI, no devices): a world group of P processes x L devices, this
//! process rank 0. Beside each step, the quadratic plan it replaced, in the same run
//! (skipped where it would take more than 4 GiB). `benches/bench_planning.sh` runs it:
//!
//!     cargo test --release -p jaxmpi-core planning_at_scale -- --ignored --nocapture

use std::hint::black_box;
use std::time::Instant;

use super::comm_sets;
use super::group::{Group, Kind};
use super::messages::{touching, Piece};
use super::place::{connected, pairs_of};

/// Layouts (processes, devices a process): the 16 x 64, then 1 k to 16 k ranks.
const LAYOUTS: [(usize, usize); 4] = [(16, 64), (1024, 1), (4096, 4), (16384, 1)];

fn world(processes: usize, local: usize) -> (Vec<i64>, Vec<i32>) {
    let n = processes * local;
    let devices = (0..n as i64).collect();
    let owners = (0..n).map(|d| (d / local) as i32).collect();
    (devices, owners)
}

fn group(devices: &[i64], owners: &[i32]) -> Group {
    let comms = comm_sets::of(Kind::Program, devices);
    Group::new(Kind::Program, devices, owners, 0, comms, None)
}

/// Best microseconds of `runs` runs of `f`.
fn best<T>(runs: usize, mut f: impl FnMut() -> T) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            black_box(f());
            t.elapsed().as_secs_f64() * 1e6
        })
        .fold(f64::INFINITY, f64::min)
}

fn piece(i: usize, j: usize) -> Piece {
    Piece {
        from: i,
        to: j,
        bytes: 4,
        send: 0,
        recv: 0,
    }
}

struct Row {
    step: &'static str,
    now_us: f64,
    now_bytes: usize,
    before: Option<(f64, usize)>,
}

fn print(layout: (usize, usize), rows: &[Row]) {
    let (p, l) = layout;
    println!("\n{p} processes x {l} devices ({} device ranks)", p * l);
    println!("| step | µs now | bytes now | µs before | bytes before | before / now |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let (before_us, before_bytes, ratio) = match r.before {
            Some((us, bytes)) => (
                format!("{us:.1}"),
                bytes.to_string(),
                format!("{:.0}", us / r.now_us.max(1e-3)),
            ),
            None => ("not run".into(), "-".into(), "-".into()),
        };
        println!(
            "| {} | {:.1} | {} | {before_us} | {before_bytes} | {ratio} |",
            r.step, r.now_us, r.now_bytes
        );
    }
}

/// The group's making as it was: each position's process found by a scan of the
/// processes seen so far (O(n x P)).
fn processes_by_scan(owners: &[i32]) -> Vec<i32> {
    let mut processes = Vec::new();
    for &p in owners {
        if !processes.contains(&p) {
            processes.push(p);
        }
    }
    processes
}

#[test]
#[ignore = "a benchmark: benches/bench_planning.sh"]
fn planning_at_scale() {
    const RUNS: usize = 5;
    const AFFORDABLE: usize = 4 << 30;
    let piece_size = std::mem::size_of::<Piece>();
    for layout @ (processes, local) in LAYOUTS {
        let (devices, owners) = world(processes, local);
        let n = devices.len();
        let g = group(&devices, &owners);
        let quadratic = n * n * piece_size <= AFFORDABLE;
        let mut rows = Vec::new();
        let scan_before = (n * processes <= 1 << 28).then(|| {
            let us = best(RUNS, || processes_by_scan(&owners));
            (us, processes * 4)
        });
        rows.push(Row {
            step: "world group made (once)",
            now_us: best(RUNS, || group(&devices, &owners)),
            now_bytes: n * (8 + 4 + 8 + 4) + processes * 12,
            before: scan_before,
        });
        // An ordered all-reduce's plan (also a tuple all-to-all's, an uneven fallback's):
        // the pieces this process sends or receives, against every pair's.
        let pieces = touching(&g, 1, |i, j, _| piece(i, j));
        rows.push(Row {
            step: "exchange plan (pieces listed)",
            now_us: best(RUNS, || touching(&g, 1, |i, j, _| piece(i, j))),
            now_bytes: pieces.capacity() * piece_size,
            before: quadratic.then(|| {
                let us = best(RUNS, || {
                    let mut all = Vec::with_capacity(n * n);
                    for i in 0..n {
                        all.extend((0..n).map(|j| piece(i, j)));
                    }
                    all
                });
                (us, n * n * piece_size)
            }),
        });
        // The communicator rank of each piece's other end, as a message is posted.
        rows.push(Row {
            step: "ranks of the plan's messages",
            now_us: best(RUNS, || {
                pieces
                    .iter()
                    .map(|p| g.rank_of(p.from) + g.rank_of(p.to))
                    .sum::<i32>()
            }),
            now_bytes: 0,
            before: (pieces.len() * processes <= 1 << 30).then(|| {
                let processes = processes_by_scan(&owners);
                let rank = |p: usize| processes.iter().position(|&q| q == owners[p]).unwrap_or(0);
                let us = best(RUNS, || {
                    pieces
                        .iter()
                        .map(|p| rank(p.from) + rank(p.to))
                        .sum::<usize>()
                });
                (us, 0)
            }),
        });
        // Packing by process (all-gather and reduce-scatter along an inner dimension):
        // every process's positions, in rank order.
        rows.push(Row {
            step: "positions of every process",
            now_us: best(RUNS, || {
                (0..g.processes())
                    .map(|r| g.positions_of(r).sum::<usize>())
                    .sum::<usize>()
            }),
            now_bytes: 0,
            before: (n * processes <= 1 << 30).then(|| {
                let processes = processes_by_scan(&owners);
                let us = best(RUNS, || {
                    processes
                        .iter()
                        .map(|&q| (0..n).filter(|&p| owners[p] == q).sum::<usize>())
                        .sum::<usize>()
                });
                (us, 0)
            }),
        });
        // A ring permute over every device, placed (once per program and device).
        let ring: Vec<i64> = (0..n as i64)
            .flat_map(|d| [d, (d + 1) % n as i64])
            .collect();
        rows.push(Row {
            step: "ring permute placed (once)",
            now_us: best(RUNS, || pairs_of(&ring, &connected(&ring)[0], &g)),
            now_bytes: 2 * local * 16,
            before: None,
        });
        print(layout, &rows);
    }
}
