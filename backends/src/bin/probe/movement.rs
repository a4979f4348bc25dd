//! Collectives that move data without combining it: bcast, gather, allgather, scatter and
//! alltoall. Receive buffers start out unlike the expected result (bcast's hold each
//! rank's own data), so a rank or block the library skipped shows.

use jaxmpi_core::{Broadcast, Dtype};

use crate::array::Array;
use crate::data::{Data, Pattern};
use crate::report::{Group, Probe};
use crate::{cases, BIG, SOME_DTYPES};

/// Roots cycle along with dtypes and sizes (see `cases`), so each op meets every root.
pub fn full(p: &mut Probe, g: &Group) {
    for (k, dtype, n) in cases(&Dtype::ALL) {
        bcast(p, g, dtype, n, (k % g.size as usize) as i32, Side::Own);
    }
    let roots = g.roots();
    for (k, dtype, n) in cases(&SOME_DTYPES) {
        let root = roots[k % roots.len()];
        gather(p, g, dtype, n, root);
        scatter(p, g, dtype, n, root);
        allgather(p, g, dtype, n);
        alltoall(p, g, dtype, n);
    }
    bcast(p, g, Dtype::F32, BIG, g.size - 1, Side::Own);
    // 8 MiB: two of the chunks every rank cuts, each a part of the one buffer.
    bcast(p, g, Dtype::F64, BIG, g.size - 1, Side::InPlace);
    allgather(p, g, Dtype::F32, BIG);
    alltoall(p, g, Dtype::BF16, BIG);
}

pub fn subset(p: &mut Probe, g: &Group) {
    for dtype in [Dtype::Bool, Dtype::F64] {
        bcast(p, g, dtype, 1001, g.size - 1, Side::Own);
        bcast(p, g, dtype, 1001, 0, Side::InPlace);
        gather(p, g, dtype, 7, 0);
        allgather(p, g, dtype, 7);
        scatter(p, g, dtype, 7, g.size - 1);
        alltoall(p, g, dtype, 7);
    }
}

/// What a rank passes to bcast: the buffer of its own side (the root's message or the
/// buffer it receives into), or the one buffer every rank passes alike (`InPlace`).
#[derive(Clone, Copy, PartialEq)]
enum Side {
    Own,
    InPlace,
}

fn bcast(p: &mut Probe, g: &Group, dtype: Dtype, n: usize, root: i32, side: Side) {
    let how = if side == Side::InPlace {
        " in place"
    } else {
        ""
    };
    let label = format!("bcast{how} {dtype} n={n} root={root} on {}", g.name);
    p.start(&label);
    let data = Data::new(&label, dtype, Pattern::Wide, g.size);
    let mut buf = data.of_rank(g.rank, n);
    let expected = data.of_rank(root, n);
    let buf_of_rank = match side {
        Side::InPlace => Broadcast::InPlace(buf.buf_mut()),
        Side::Own if g.rank == root => Broadcast::Root(buf.buf()),
        Side::Own => Broadcast::Receiver(buf.buf_mut()),
    };
    let result = p.backend.bcast(g.comm, buf_of_rank, root);
    p.result(&label, result, &expected, &buf);
}

fn gather(p: &mut Probe, g: &Group, dtype: Dtype, n: usize, root: i32) {
    let label = format!("gather {dtype} n={n} root={root} on {}", g.name);
    p.start(&label);
    let data = Data::new(&label, dtype, Pattern::Wide, g.size);
    let send = data.of_rank(g.rank, n);
    // The receive buffer is significant at the root only: elsewhere it is empty.
    let total = if g.rank == root {
        n * g.size as usize
    } else {
        0
    };
    let mut recv = Array::zeroed(dtype, total);
    let expected = Array::from_fn(dtype, total, |i| data.value((i / n) as i32, i % n));
    let result = p
        .backend
        .gather(g.comm, send.buf(), recv.buf_mut(), root)
        .map(|_| ());
    p.result(&label, result, &expected, &recv);
}

fn allgather(p: &mut Probe, g: &Group, dtype: Dtype, n: usize) {
    let label = format!("allgather {dtype} n={n} on {}", g.name);
    p.start(&label);
    let data = Data::new(&label, dtype, Pattern::Wide, g.size);
    let send = data.of_rank(g.rank, n);
    let total = n * g.size as usize;
    let mut recv = Array::zeroed(dtype, total);
    let expected = Array::from_fn(dtype, total, |i| data.value((i / n) as i32, i % n));
    let result = p.backend.allgather(g.comm, send.buf(), recv.buf_mut());
    p.result(&label, result, &expected, &recv);
}

fn scatter(p: &mut Probe, g: &Group, dtype: Dtype, n: usize, root: i32) {
    let label = format!("scatter {dtype} n={n} root={root} on {}", g.name);
    p.start(&label);
    let data = Data::new(&label, dtype, Pattern::Wide, g.size);
    let total = if g.rank == root {
        n * g.size as usize
    } else {
        0
    };
    let send = data.of_rank(root, total);
    let mut recv = Array::zeroed(dtype, n);
    let offset = n * g.rank as usize;
    let expected = Array::from_fn(dtype, n, |i| data.value(root, offset + i));
    let result = p.backend.scatter(g.comm, send.buf(), recv.buf_mut(), root);
    p.result(&label, result, &expected, &recv);
}

/// Block j of rank r's input goes to rank j, so rank r receives block r of everyone's.
fn alltoall(p: &mut Probe, g: &Group, dtype: Dtype, n: usize) {
    let label = format!("alltoall {dtype} n={n} on {}", g.name);
    p.start(&label);
    let data = Data::new(&label, dtype, Pattern::Wide, g.size);
    let total = n * g.size as usize;
    let send = data.of_rank(g.rank, total);
    let mut recv = Array::zeroed(dtype, total);
    let mine = n * g.rank as usize;
    let expected = Array::from_fn(dtype, total, |i| data.value((i / n) as i32, mine + i % n));
    let result = p.backend.alltoall(g.comm, send.buf(), recv.buf_mut());
    p.result(&label, result, &expected, &recv);
}
