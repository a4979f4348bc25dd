//! Each collective's whole call, as one process of a cluster makes it, at 1 k, 4 k and 16 k
//! device ranks, one and 8 devices a process, in both reduction modes: the time and the
//! bytes it allocates per call, and how they grow from 1 k to 16 k ranks. The process is
//! rank 0 of a simulated cluster (`simulated.rs`: MPI calls counted, nothing moved); the
//! collectives run their own code on real buffers of its devices.
//! `benches/bench_planning.sh` runs it beside `planning_bench.rs`:
//!
//!     cargo test --release -p jaxmpi-core --lib collectives_at_scale -- --ignored --nocapture

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::collectives::{self, AllToAll};
use super::comm_sets::{self, Kind};
use super::group::Group;
use super::place::{connected, pairs_of};
use super::seat::{CallKey, Seat, Span};
use super::simulated::Simulated;
use super::{ordered, ragged, reductions};
use crate::{Comm, Dtype, ReduceOp, Result};

/// Bytes allocated by every thread of this test binary so far.
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: forwards every request to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded from the caller.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        // SAFETY: forwarded from the caller.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Processes for 1 k, 4 k and 16 k device ranks, at each number of devices a process.
const SCALES: [(usize, [usize; 3]); 2] = [(1, [1024, 4096, 16384]), (8, [128, 512, 2048])];
/// Elements of a member's block.
const BLOCK: usize = 4;
/// Slices of an inner-dimension all-gather or reduce-scatter.
const INNER: usize = 4;

/// A world group of `processes` x `local` devices, seen from process 0, its communicators
/// made (a permute's: of its processes, its messages tagged by slot).
fn world(processes: usize, local: usize, kind: Kind) -> Group {
    let n = processes * local;
    let devices: Vec<i64> = (0..n as i64).collect();
    let owners: Vec<i32> = (0..n).map(|d| (d / local) as i32).collect();
    let (comms, tags) = match kind {
        Kind::Permute => {
            let members: Vec<i64> = owners.iter().map(|&p| i64::from(p)).collect();
            let slots = (0..n).map(|d| d % local).collect();
            (comm_sets::of(kind, &members), Some((slots, local)))
        }
        _ => (comm_sets::of(kind, &devices), None),
    };
    for made in [&comms.comm, &comms.p2p] {
        made.get(|| Ok(Comm(1))).expect("a simulated communicator");
    }
    Group::new(kind, &devices, &owners, 0, comms, tags)
}

/// Buffers of this process's devices, kept alive while their seats are used.
#[derive(Default)]
struct Memory(Vec<Vec<u64>>);

impl Memory {
    fn span(&mut self, count: usize, dtype: Dtype) -> Span {
        let words = (count * dtype.size()).div_ceil(8).max(1);
        self.0.push(vec![0; words]);
        Span {
            ptr: self.0.last().expect("just pushed").as_ptr() as usize,
            count,
            dtype,
        }
    }

    fn integers(&mut self, values: &[i64]) -> Span {
        let span = self.span(values.len(), Dtype::I64);
        // SAFETY: the span was just allocated for `values.len()` i64.
        unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr(), span.ptr as *mut i64, values.len())
        };
        span
    }
}

/// A collective as one process calls it on its seats.
type Call<'a> = Box<dyn Fn(&Group, &Simulated, &[Seat]) -> Result<()> + 'a>;
/// The seats of a process's devices for a call, their buffers in the memory given.
type Seats<'a> = Box<dyn Fn(&Group, &mut Memory) -> Vec<Seat> + 'a>;
/// A ring permute's local pairs (and its hash) by group size, as the place cache keeps them.
type Placed = std::collections::HashMap<usize, (Vec<(usize, usize)>, u64)>;

/// A case: its name, the group's kind, the seats of the process's devices, the call.
struct Case<'a> {
    name: &'static str,
    kind: Kind,
    seats: Seats<'a>,
    call: Call<'a>,
}

fn seats_of(group: &Group, mut one: impl FnMut(usize) -> Seat) -> Vec<Seat> {
    group.local.iter().map(|&p| one(p)).collect()
}

/// One operand of `args` and one result of `rets` elements (f32) a device.
fn plain(group: &Group, memory: &mut Memory, args: usize, rets: usize) -> Vec<Seat> {
    seats_of(group, |_| {
        let (x, y) = (memory.span(args, Dtype::F32), memory.span(rets, Dtype::F32));
        Seat::of_buffers(CallKey::new("bench", 0), x, y)
    })
}

fn cases<'a>() -> Vec<Case<'a>> {
    let sum = ReduceOp::Sum;
    vec![
        Case {
            name: "all-reduce, fast",
            kind: Kind::Program,
            seats: Box::new(|g, m| plain(g, m, BLOCK, BLOCK)),
            call: Box::new(move |g, s, seats| reductions::all_reduce(g, s, seats, sum)),
        },
        Case {
            name: "all-reduce, ordered",
            kind: Kind::Program,
            seats: Box::new(|g, m| plain(g, m, BLOCK * g.size(), BLOCK * g.size())),
            call: Box::new(move |g, s, seats| ordered::all_reduce(g, s, seats, sum)),
        },
        Case {
            name: "all-gather, outermost",
            kind: Kind::Program,
            seats: Box::new(|g, m| plain(g, m, BLOCK, BLOCK * g.size())),
            call: Box::new(|g, s, seats| collectives::all_gather(g, s, s, seats, &[1])),
        },
        Case {
            name: "all-gather, inner dimension",
            kind: Kind::Program,
            seats: Box::new(|g, m| plain(g, m, INNER * BLOCK, INNER * BLOCK * g.size())),
            call: Box::new(|g, s, seats| collectives::all_gather(g, s, s, seats, &[INNER])),
        },
        Case {
            name: "reduce-scatter, outermost, fast",
            kind: Kind::Program,
            seats: Box::new(|g, m| plain(g, m, BLOCK * g.size(), BLOCK)),
            call: Box::new(move |g, s, seats| reductions::reduce_scatter(g, s, seats, &[1], sum)),
        },
        Case {
            name: "reduce-scatter, inner dimension, fast",
            kind: Kind::Program,
            seats: Box::new(|g, m| plain(g, m, INNER * BLOCK * g.size(), INNER * BLOCK)),
            call: Box::new(move |g, s, seats| {
                reductions::reduce_scatter(g, s, seats, &[INNER], sum)
            }),
        },
        Case {
            name: "reduce-scatter, outermost, ordered",
            kind: Kind::Program,
            seats: Box::new(|g, m| plain(g, m, BLOCK * g.size(), BLOCK)),
            call: Box::new(move |g, s, seats| ordered::reduce_scatter(g, s, seats, 0, 1, sum)),
        },
        Case {
            name: "all-to-all, array",
            kind: Kind::Program,
            seats: Box::new(|g, m| plain(g, m, BLOCK * g.size(), BLOCK * g.size())),
            call: Box::new(|g, s, seats| {
                collectives::all_to_all(g, s, s, seats, AllToAll::Array { outer: 1 })
            }),
        },
        Case {
            name: "all-to-all, tuple",
            kind: Kind::Program,
            seats: Box::new(|g, m| {
                seats_of(g, |_| {
                    let args: Vec<Span> =
                        (0..g.size()).map(|_| m.span(BLOCK, Dtype::F32)).collect();
                    let rets: Vec<Span> =
                        (0..g.size()).map(|_| m.span(BLOCK, Dtype::F32)).collect();
                    Seat::of_buffers(CallKey::new("bench", 0), args, rets)
                })
            }),
            call: Box::new(|g, s, seats| collectives::all_to_all(g, s, s, seats, AllToAll::Arrays)),
        },
        Case {
            name: "ragged all-to-all (a row to each member)",
            kind: Kind::Program,
            seats: Box::new(|g, m| {
                let n = g.size();
                let starts: Vec<i64> = (0..n as i64).collect();
                seats_of(g, |p| {
                    let args = vec![
                        m.span(n, Dtype::F32),
                        m.span(n, Dtype::F32),
                        m.integers(&starts),
                        m.integers(&vec![1; n]),
                        m.integers(&vec![p as i64; n]),
                    ];
                    Seat::of_buffers(CallKey::new("bench", 0), args, m.span(n, Dtype::F32))
                })
            }),
            call: Box::new(|g, s, seats| {
                ragged::ragged_all_to_all(g, s, s, seats, Dtype::F32.size(), "ragged_all_to_all")
            }),
        },
        Case {
            name: "ring permute",
            kind: Kind::Permute,
            seats: Box::new(|g, m| plain(g, m, BLOCK, BLOCK)),
            call: Box::new(|g, s, seats| {
                // Placed once per program and device, as the place cache keeps it: not part
                // of a call.
                PLACED.with(|placed| {
                    let mut placed = placed.borrow_mut();
                    let (pairs, _) = placed.entry(g.size()).or_insert_with(|| {
                        let n = g.size() as i64;
                        let ring: Vec<i64> = (0..n).flat_map(|d| [d, (d + 1) % n]).collect();
                        pairs_of(&ring, &connected(&ring)[0], g)
                    });
                    collectives::permute(g, s, s, seats, pairs)
                })
            }),
        },
    ]
}

thread_local! {
    static PLACED: std::cell::RefCell<Placed> = Default::default();
}

/// Best microseconds of a call, the bytes one call allocates, and its MPI calls.
fn measure(case: &Case, group: &Group, seats: &[Seat]) -> (f64, usize, usize) {
    let simulated = Simulated::new();
    (case.call)(group, &simulated, seats).expect("the warm-up call");
    let calls = simulated.calls();
    let before = ALLOCATED.load(Ordering::Relaxed);
    (case.call)(group, &simulated, seats).expect("a call");
    let bytes = ALLOCATED.load(Ordering::Relaxed) - before;
    let best = (0..5)
        .map(|_| {
            let t = Instant::now();
            black_box((case.call)(group, &simulated, seats)).expect("a call");
            t.elapsed().as_secs_f64() * 1e6
        })
        .fold(f64::INFINITY, f64::min);
    (best, bytes, calls)
}

#[test]
#[ignore = "a benchmark: benches/bench_planning.sh"]
fn collectives_at_scale() {
    println!(
        "| collective | devices a process | µs at 1 k / 4 k / 16 k ranks | 16 k / 1 k | \
         bytes allocated at 1 k / 4 k / 16 k | 16 k / 1 k | MPI calls at 16 k (MPI_Reduce_local too) |"
    );
    println!("|---|---:|---|---:|---|---:|---:|");
    // A part of the name picks the cases (to profile one).
    let only = std::env::var("JAXMPI_BENCH_CASE").unwrap_or_default();
    for case in cases().into_iter().filter(|c| c.name.contains(&only)) {
        for (local, processes) in SCALES {
            let mut rows = Vec::new();
            for p in processes {
                let group = world(p, local, case.kind);
                let mut memory = Memory::default();
                let seats = (case.seats)(&group, &mut memory);
                rows.push(measure(&case, &group, &seats));
            }
            let list = |f: &dyn Fn(&(f64, usize, usize)) -> String| {
                rows.iter().map(f).collect::<Vec<_>>().join(" / ")
            };
            let (first, last) = (&rows[0], &rows[2]);
            println!(
                "| {} | {local} | {} | {:.1} | {} | {:.1} | {} |",
                case.name,
                list(&|r| format!("{:.1}", r.0)),
                last.0 / first.0.max(1e-3),
                list(&|r| r.1.to_string()),
                last.1 as f64 / first.1.max(1) as f64,
                last.2
            );
        }
    }
}
