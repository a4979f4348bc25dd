//! The variable-count collectives: gatherv, allgatherv, scatterv and alltoallv, with uneven
//! counts (zero among them) and blocks laid out out of rank order with gaps.

use jaxmpi_core::{Dtype, Partition, PartitionMut};

use crate::array::{Array, Value};
use crate::data::{Data, Pattern};
use crate::report::{Group, Probe};
use crate::SOME_DTYPES;

/// Elements left untouched after each block.
const GAP: usize = 2;
/// Index distance between the blocks a rank sends to different ranks, so every block of
/// every sender has its own values.
const STRIDE: usize = 1 << 24;

/// Rank j's block in gatherv/allgatherv/scatterv.
fn count(j: usize, scale: usize) -> usize {
    [3, 0, 7, 1][j % 4] * scale
}

/// What rank `from` sends rank `to` in alltoallv: uneven in both directions.
fn pair_count(from: usize, to: usize, scale: usize) -> usize {
    [3, 0, 7, 1, 2][(from + 2 * to) % 5] * scale
}

/// One block per rank, in reverse rank order with a gap after each: a library that
/// ignored the displacements, or wrote outside a block, would show.
struct Layout {
    counts: Vec<usize>,
    displs: Vec<usize>,
    len: usize,
}

impl Layout {
    fn new(counts: Vec<usize>) -> Layout {
        let mut displs = vec![0; counts.len()];
        let mut end = 0;
        for j in (0..counts.len()).rev() {
            displs[j] = end;
            end += counts[j] + GAP;
        }
        Layout {
            counts,
            displs,
            len: end,
        }
    }

    /// A buffer with `block(j, k)` at element k of block j and filler in the gaps.
    fn fill(&self, gaps: &Data, block: impl Fn(usize, usize) -> Value) -> Array {
        Array::from_fn(gaps.dtype, self.len, |at| {
            let owner = (0..self.counts.len())
                .find(|&j| (self.displs[j]..self.displs[j] + self.counts[j]).contains(&at));
            match owner {
                Some(j) => block(j, at - self.displs[j]),
                None => gaps.value(-1, at),
            }
        })
    }

    /// The buffer before a receive: filler everywhere.
    fn blank(&self, gaps: &Data) -> Array {
        Array::from_fn(gaps.dtype, self.len, |at| gaps.value(-1, at))
    }
}

/// The test's data and the filler for its gaps.
fn data(label: &str, dtype: Dtype, g: &Group) -> (Data, Data) {
    (
        Data::new(label, dtype, Pattern::Wide, g.size),
        Data::new(&format!("{label} gaps"), dtype, Pattern::Wide, g.size),
    )
}

pub fn full(p: &mut Probe, g: &Group) {
    // Scales and roots cycle along with the dtypes (see `cases` for why).
    let roots = g.roots();
    for (k, dtype) in SOME_DTYPES.into_iter().enumerate() {
        let scale = [143, 1][k % 2];
        let root = roots[k / 2 % roots.len()];
        gatherv(p, g, dtype, scale, root);
        scatterv(p, g, dtype, scale, root);
        allgatherv(p, g, dtype, scale);
        alltoallv(p, g, dtype, scale);
    }
}

pub fn subset(p: &mut Probe, g: &Group) {
    for dtype in [Dtype::I8, Dtype::C128] {
        gatherv(p, g, dtype, 5, g.size - 1);
        scatterv(p, g, dtype, 5, 0);
        allgatherv(p, g, dtype, 5);
        alltoallv(p, g, dtype, 5);
    }
}

fn gatherv(p: &mut Probe, g: &Group, dtype: Dtype, scale: usize, root: i32) {
    let label = format!("gatherv {dtype} scale={scale} root={root} on {}", g.name);
    p.start(&label);
    let (data, gaps) = data(&label, dtype, g);
    let layout = Layout::new((0..g.size as usize).map(|j| count(j, scale)).collect());
    let send = data.of_rank(g.rank, count(g.rank as usize, scale));
    let (mut recv, expected) = if g.rank == root {
        let expected = layout.fill(&gaps, |j, k| data.value(j as i32, k));
        (layout.blank(&gaps), expected)
    } else {
        (Array::zeroed(dtype, 0), Array::zeroed(dtype, 0))
    };
    let (counts, displs) = (&layout.counts, &layout.displs);
    let into = PartitionMut::new(recv.buf_mut(), counts, displs);
    let result = p
        .backend
        .gatherv(g.comm, send.buf(), into, root)
        .map(|_| ());
    p.result(&label, result, &expected, &recv);
}

fn allgatherv(p: &mut Probe, g: &Group, dtype: Dtype, scale: usize) {
    let label = format!("allgatherv {dtype} scale={scale} on {}", g.name);
    p.start(&label);
    let (data, gaps) = data(&label, dtype, g);
    let layout = Layout::new((0..g.size as usize).map(|j| count(j, scale)).collect());
    let send = data.of_rank(g.rank, count(g.rank as usize, scale));
    let mut recv = layout.blank(&gaps);
    let expected = layout.fill(&gaps, |j, k| data.value(j as i32, k));
    let (counts, displs) = (&layout.counts, &layout.displs);
    let into = PartitionMut::new(recv.buf_mut(), counts, displs);
    let result = p.backend.allgatherv(g.comm, send.buf(), into);
    p.result(&label, result, &expected, &recv);
}

fn scatterv(p: &mut Probe, g: &Group, dtype: Dtype, scale: usize, root: i32) {
    let label = format!("scatterv {dtype} scale={scale} root={root} on {}", g.name);
    p.start(&label);
    let (data, gaps) = data(&label, dtype, g);
    let layout = Layout::new((0..g.size as usize).map(|j| count(j, scale)).collect());
    // The send buffer is significant at the root only.
    let send = if g.rank == root {
        layout.fill(&gaps, |j, k| data.value(root, j * STRIDE + k))
    } else {
        Array::zeroed(dtype, 0)
    };
    let n = count(g.rank as usize, scale);
    let mut recv = Array::zeroed(dtype, n);
    let mine = g.rank as usize * STRIDE;
    let expected = Array::from_fn(dtype, n, |k| data.value(root, mine + k));
    let (counts, displs) = (&layout.counts, &layout.displs);
    let from = Partition::new(send.buf(), counts, displs);
    let result = p.backend.scatterv(g.comm, from, recv.buf_mut(), root);
    p.result(&label, result, &expected, &recv);
}

fn alltoallv(p: &mut Probe, g: &Group, dtype: Dtype, scale: usize) {
    let label = format!("alltoallv {dtype} scale={scale} on {}", g.name);
    p.start(&label);
    let (data, gaps) = data(&label, dtype, g);
    let (rank, ranks) = (g.rank as usize, 0..g.size as usize);
    let sent = Layout::new(ranks.clone().map(|j| pair_count(rank, j, scale)).collect());
    let received = Layout::new(ranks.map(|j| pair_count(j, rank, scale)).collect());
    let send = sent.fill(&gaps, |j, k| data.value(g.rank, j * STRIDE + k));
    let mut recv = received.blank(&gaps);
    let expected = received.fill(&gaps, |j, k| data.value(j as i32, rank * STRIDE + k));
    let from = Partition::new(send.buf(), &sent.counts, &sent.displs);
    let into = PartitionMut::new(recv.buf_mut(), &received.counts, &received.displs);
    let result = p.backend.alltoallv(g.comm, from, into);
    p.result(&label, result, &expected, &recv);
}
