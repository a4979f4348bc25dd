//! Reductions: allreduce, reduce, scan, exscan and reduce_scatter.

use std::ops::Range;

use jaxmpi_core::{Dtype, Input, ReduceOp};

use crate::array::Array;
use crate::data::{Data, Pattern};
use crate::report::{Group, Probe};
use crate::{cases, BIG, SIZES, SOME_DTYPES};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Allreduce,
    Reduce { root: i32 },
    Scan,
    Exscan,
    ReduceScatter,
}

impl Kind {
    fn label(self) -> String {
        match self {
            Kind::Allreduce => "allreduce".into(),
            Kind::Reduce { root } => format!("reduce root={root}"),
            Kind::Scan => "scan".into(),
            Kind::Exscan => "exscan".into(),
            Kind::ReduceScatter => "reduce_scatter".into(),
        }
    }

    /// The ranks whose contributions make up this rank's result; `None` where MPI leaves
    /// the result unspecified or the buffer is not significant.
    fn contributors(self, g: &Group) -> Option<Range<i32>> {
        match self {
            Kind::Allreduce | Kind::ReduceScatter => Some(0..g.size),
            Kind::Reduce { root } => (g.rank == root).then_some(0..g.size),
            Kind::Scan => Some(0..g.rank + 1),
            Kind::Exscan => (g.rank > 0).then_some(0..g.rank),
        }
    }
}

/// Every op on every dtype it supports, then the other reductions on a sample of ops and
/// dtypes. MPI_IN_PLACE alternates: its handling does not depend on op or dtype.
pub fn full(p: &mut Probe, g: &Group) {
    for (k, (op, dtype)) in pairs(&ReduceOp::PREDEFINED, &Dtype::ALL).enumerate() {
        reduction(p, g, Kind::Allreduce, op, dtype, 1001, k % 2 == 1);
    }
    for (k, dtype, n) in cases(&Dtype::ALL).filter(|&(_, d, n)| n < 1001 && d != Dtype::Bool) {
        reduction(p, g, Kind::Allreduce, ReduceOp::Sum, dtype, n, k % 4 == 1);
    }
    reduction(p, g, Kind::Allreduce, ReduceOp::Sum, Dtype::F32, BIG, false);
    reduction(p, g, Kind::Allreduce, ReduceOp::Max, Dtype::I8, BIG, true);

    // The other reductions share allreduce's op and dtype handling, so one op of each
    // pattern (sum, product, order, logical, bitwise) suffices. Each pair runs once per
    // kind, cycling through the sizes and in place (see `cases` for why).
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Lxor,
        ReduceOp::Bor,
    ];
    let mut kinds: Vec<Kind> = g
        .roots()
        .into_iter()
        .map(|root| Kind::Reduce { root })
        .collect();
    kinds.extend([Kind::Scan, Kind::Exscan, Kind::ReduceScatter]);
    for kind in kinds {
        for (k, (op, dtype)) in pairs(&ops, &SOME_DTYPES).enumerate() {
            let in_place = k % 3 == 0 && !matches!(kind, Kind::ReduceScatter);
            reduction(p, g, kind, op, dtype, SIZES[k % SIZES.len()], in_place);
        }
    }
}

/// Every (op, dtype) pair MPI defines.
fn pairs<'a>(
    ops: &'a [ReduceOp],
    dtypes: &'a [Dtype],
) -> impl Iterator<Item = (ReduceOp, Dtype)> + 'a {
    ops.iter()
        .flat_map(move |&op| dtypes.iter().map(move |&dtype| (op, dtype)))
        .filter(|&(op, dtype)| op.supports(dtype))
}

/// A short pass for derived communicators: enough to show the handle is used throughout.
pub fn subset(p: &mut Probe, g: &Group) {
    for dtype in [Dtype::I32, Dtype::BF16, Dtype::C128] {
        reduction(p, g, Kind::Allreduce, ReduceOp::Sum, dtype, 1001, false);
        reduction(p, g, Kind::Allreduce, ReduceOp::Prod, dtype, 7, true);
        reduction(p, g, Kind::Scan, ReduceOp::Sum, dtype, 7, false);
        let root = g.size - 1;
        reduction(p, g, Kind::Reduce { root }, ReduceOp::Sum, dtype, 7, false);
        reduction(p, g, Kind::ReduceScatter, ReduceOp::Sum, dtype, 7, false);
    }
}

/// One reduction and its check. `in_place`: the input starts in the receive buffer.
fn reduction(
    p: &mut Probe,
    g: &Group,
    kind: Kind,
    op: ReduceOp,
    dtype: Dtype,
    n: usize,
    in_place: bool,
) {
    let place = if in_place { " in place" } else { "" };
    let label = format!("{} {op} {dtype} n={n}{place} on {}", kind.label(), g.name);
    p.start(&label);
    let data = Data::new(&label, dtype, Pattern::for_op(op), g.size);
    let size = g.size as usize;
    // reduce_scatter's input holds one block of n per rank; this rank receives block `rank`.
    let (input_len, offset) = match kind {
        Kind::ReduceScatter => (n * size, n * g.rank as usize),
        _ => (n, 0),
    };
    let input = data.of_rank(g.rank, input_len);
    let mut out = match kind {
        _ if in_place => input.clone(),
        // Not significant away from the root: an empty buffer must do.
        Kind::Reduce { root } if g.rank != root => Array::zeroed(dtype, 0),
        _ => Array::zeroed(dtype, n),
    };
    // Where there is no result the receive buffer must come back untouched, except on
    // exscan's rank 0, which MPI leaves unspecified.
    let expected = match kind.contributors(g) {
        Some(ranks) => Some(Array::from_fn(dtype, n, |i| {
            data.reduced(op, ranks.clone(), offset + i)
        })),
        None if matches!(kind, Kind::Exscan) => None,
        None => Some(out.clone()),
    };
    let send = if in_place {
        Input::InPlace
    } else {
        Input::Data(input.buf())
    };
    let (b, comm) = (p.backend, g.comm);
    let result = match kind {
        Kind::Allreduce => b.allreduce(comm, send, out.buf_mut(), op),
        Kind::Reduce { root } => b.reduce(comm, send, out.buf_mut(), op, root),
        Kind::Scan => b.scan(comm, send, out.buf_mut(), op),
        Kind::Exscan => b.exscan(comm, send, out.buf_mut(), op),
        Kind::ReduceScatter => b.reduce_scatter(comm, input.buf(), out.buf_mut(), op),
    };
    if p.ok(&label, result).is_some() {
        if let Some(expected) = expected {
            p.data(&label, &expected, &out);
        }
    }
}
