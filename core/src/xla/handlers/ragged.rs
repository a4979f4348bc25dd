//! The exchange whose counts are computed inside `jit`: `ragged_alltoallv`, MPI_Alltoallv
//! with its row counts and displacements read from int64 operands at run time. Python
//! builds every op with run-time counts on it (alltoallv, gatherv, allgatherv, scatterv,
//! ragged_all_to_all), so this file is the one place such counts are checked.
//!
//! Counts that do not fit must fail every rank alike, never write past a buffer and never
//! hang. Before the exchange the ranks make two fixed-size calls, whatever the counts: an
//! alltoall of the send counts (each receiver compares what is coming with what it
//! expects) and an allgather of one verdict per rank. A rank whose own counts are bad
//! (negative, past a buffer, disagreeing with its senders) says why with the numbers; the
//! others name that rank; nobody calls MPI_Alltoallv.

use super::attrs;
use crate::xla::frame::{Call, Operand};
use crate::{Backend, Buf, BufMut, Comm, Dtype, Error, Library, Partition, PartitionMut, Result};

/// The public ops built on this one, by the `origin` attribute: what errors name. Python
/// reads this list (`_native.ragged_origins()`) to encode the attribute.
pub const ORIGINS: [&str; 5] = [
    "alltoallv",
    "gatherv",
    ALLGATHERV,
    "scatterv",
    "ragged_all_to_all",
];

/// The one origin that moves by another MPI call (MPI_Allgatherv).
const ALLGATHERV: &str = "allgatherv";

/// One rank's blocks, in rows, as its operands give them (signed: checked here).
struct Rows {
    send_displs: Vec<i64>,
    send_counts: Vec<i64>,
    recv_displs: Vec<i64>,
    recv_counts: Vec<i64>,
}

fn integers(operand: &Operand, what: &str, size: usize) -> Result<Vec<i64>> {
    let values = operand.integers()?;
    if values.len() != size {
        return Err(Error::invalid_argument(
            "ragged_alltoallv",
            format!(
                "{what} has {} entries, but the communicator has {size} ranks",
                values.len()
            ),
        ));
    }
    Ok(values)
}

fn to_bytes(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

fn from_bytes(bytes: &[u8]) -> Vec<i64> {
    let word = |chunk: &[u8]| i64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
    bytes.chunks_exact(8).map(word).collect()
}

/// Every rank of `comm` gets `mine` (the same length on every rank) from every rank, in
/// host memory through the library's host backend (`alltoall`: block p goes to rank p).
fn exchange(library: &dyn Library, comm: Comm, mine: &[i64], all_to_all: bool) -> Result<Vec<i64>> {
    let size = library.comm_size(comm)? as usize;
    let send = to_bytes(mine);
    let mut got = vec![
        0u8;
        if all_to_all {
            send.len()
        } else {
            send.len() * size
        }
    ];
    let (send, recv) = (
        Buf::from_bytes(&send, Dtype::I64)?,
        BufMut::from_bytes(&mut got, Dtype::I64)?,
    );
    let host = library.backend();
    if all_to_all {
        host.alltoall(comm, send, recv)?;
    } else {
        host.allgather(comm, send, recv)?;
    }
    Ok(from_bytes(&got))
}

/// What is wrong with this rank's blocks, if anything: `incoming[p]` is what rank p sends
/// here, `rows` the rows of the send operand and of the result.
fn fault(rows: &Rows, incoming: &[i64], (send_rows, recv_rows): (usize, usize)) -> Option<String> {
    let sides = [
        (
            "send",
            &rows.send_displs,
            &rows.send_counts,
            send_rows,
            "the operand",
        ),
        (
            "receive",
            &rows.recv_displs,
            &rows.recv_counts,
            recv_rows,
            "the result",
        ),
    ];
    for (side, displs, counts, room, buffer) in sides {
        for (peer, (&displ, &count)) in displs.iter().zip(counts).enumerate() {
            if displ < 0 || count < 0 {
                return Some(format!(
                    "{side} block of rank {peer} has offset {displ} and count {count}: \
                     neither may be negative"
                ));
            }
            if displ as u64 + count as u64 > room as u64 {
                return Some(format!(
                    "{side} block of rank {peer} (rows {displ} to {}) ends past {buffer}'s \
                     {room} rows{}",
                    displ + count,
                    if side == "receive" {
                        "; give a larger recv_capacity"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    if let Some(why) = overlap(&rows.recv_displs, &rows.recv_counts) {
        return Some(why);
    }
    let disagree = incoming.iter().zip(&rows.recv_counts).enumerate();
    for (peer, (&sent, &expected)) in disagree {
        if sent != expected {
            return Some(format!(
                "rank {peer} sends {sent} rows here, but this rank expects {expected} from it"
            ));
        }
    }
    None
}

/// Two senders' blocks written over the same rows (MPI leaves the result undefined).
/// Called once every block is known to be inside the result.
fn overlap(displs: &[i64], counts: &[i64]) -> Option<String> {
    let mut blocks: Vec<(i64, i64, usize)> = (0..displs.len())
        .filter(|&p| counts[p] > 0)
        .map(|p| (displs[p], displs[p] + counts[p], p))
        .collect();
    blocks.sort_unstable();
    blocks.windows(2).find(|w| w[1].0 < w[0].1).map(|w| {
        let ((a_start, a_end, a), (b_start, b_end, b)) = (w[0], w[1]);
        format!(
            "the blocks from rank {a} (rows {a_start} to {a_end}) and rank {b} (rows \
             {b_start} to {b_end}) overlap in the result"
        )
    })
}

/// An allgatherv's send side as Python builds it: the same rows to every rank (what lets
/// MPI_Allgatherv carry it).
fn not_one_block(rows: &Rows) -> Option<String> {
    let first = (rows.send_displs[0], rows.send_counts[0]);
    let blocks = rows.send_displs.iter().zip(&rows.send_counts);
    let differs = blocks.enumerate().find(|&(_, (&d, &c))| (d, c) != first)?;
    let (peer, (displ, count)) = differs;
    Some(format!(
        "internal error: an allgatherv sends rows {} to {} to rank 0 but rows {displ} to {} \
         to rank {peer}",
        first.0,
        first.0 + first.1,
        displ + count
    ))
}

fn elements(displs: &[i64], counts: &[i64], row: usize) -> (Vec<usize>, Vec<usize>) {
    let scale = |values: &[i64]| values.iter().map(|&v| v as usize * row).collect();
    (scale(counts), scale(displs))
}

pub fn ragged_alltoallv(
    call: &Call,
    library: &dyn Library,
    backend: &dyn Backend,
    a: &attrs::RaggedAlltoallv,
) -> Result<()> {
    let origin = usize::try_from(a.origin)
        .ok()
        .and_then(|i| ORIGINS.get(i).copied())
        .ok_or_else(|| call.bad_attr("origin", format_args!("= {} names no op", a.origin)))?;
    let size = library.comm_size(a.comm)? as usize;
    let (x, y) = (call.arg(0)?, call.ret(0)?);
    let rows = Rows {
        send_displs: integers(&call.arg(2)?, "send offsets", size)?,
        send_counts: integers(&call.arg(3)?, "send counts", size)?,
        recv_displs: integers(&call.arg(4)?, "receive offsets", size)?,
        recv_counts: integers(&call.arg(5)?, "receive counts", size)?,
    };
    let row = x.row();
    // Rows of nothing fit anywhere: nothing is moved.
    let room = |o: &Operand| o.count().checked_div(row).unwrap_or(usize::MAX);
    // Negative sends travel as they are: the receiver sees them disagree, the sender
    // reports them itself.
    let incoming = exchange(library, a.comm, &rows.send_counts, true)?;
    let mine = fault(&rows, &incoming, (room(&x), room(&y))).or_else(|| {
        (origin == ALLGATHERV)
            .then(|| not_one_block(&rows))
            .flatten()
    });
    // Each rank's verdict and op: an allgatherv moves by MPI_Allgatherv, the others by
    // MPI_Alltoallv, so ranks calling different ops must stop here, not meet in
    // different MPI calls.
    let op = i64::from(a.origin);
    let said = exchange(library, a.comm, &[i64::from(mine.is_some()), op], false)?;
    let (verdicts, origins): (Vec<i64>, Vec<i64>) = said.chunks(2).map(|v| (v[0], v[1])).unzip();
    if let Some(other) = origins.iter().position(|&o| o != op) {
        let name = |o: i64| {
            usize::try_from(o)
                .ok()
                .and_then(|i| ORIGINS.get(i))
                .copied()
        };
        return Err(Error::invalid_argument(
            "ragged_alltoallv",
            format!(
                "the ranks call different ops with run-time counts: this rank {origin}, rank \
                 {other} {}; every rank of the communicator must make the same call",
                name(origins[other]).unwrap_or("an unknown op")
            ),
        ));
    }
    let bad: Vec<usize> = (0..size).filter(|&r| verdicts[r] != 0).collect();
    if let Some(why) = mine {
        return Err(Error::invalid_argument(
            "ragged_alltoallv",
            format!("{origin} with run-time counts: {why}"),
        ));
    }
    if !bad.is_empty() {
        return Err(Error::invalid_argument(
            "ragged_alltoallv",
            format!(
                "{origin} with run-time counts: rank(s) {bad:?} got counts that do not fit \
                 (their errors say which); no rank exchanged data"
            ),
        ));
    }
    let (send_counts, send_displs) = elements(&rows.send_displs, &rows.send_counts, row);
    let (recv_counts, recv_displs) = elements(&rows.recv_displs, &rows.recv_counts, row);
    let recv = PartitionMut::new(y.buf_mut()?, &recv_counts, &recv_displs);
    if origin == ALLGATHERV {
        // One block to every rank: MPI_Allgatherv picks its own algorithm for it, and on
        // a MeshComm each remote block then reaches a process once, not once per device.
        let mine = x.buf()?.part(send_displs[0], send_counts[0]);
        return backend.allgatherv(a.comm, mine, recv);
    }
    let send = Partition::new(x.buf()?, &send_counts, &send_displs);
    backend.alltoallv(a.comm, send, recv)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(send: (&[i64], &[i64]), recv: (&[i64], &[i64])) -> Rows {
        Rows {
            send_displs: send.0.to_vec(),
            send_counts: send.1.to_vec(),
            recv_displs: recv.0.to_vec(),
            recv_counts: recv.1.to_vec(),
        }
    }

    #[test]
    fn blocks_that_fit_and_agree_pass() {
        let r = rows((&[0, 2], &[2, 1]), (&[0, 3], &[3, 0]));
        assert_eq!(fault(&r, &[3, 0], (3, 3)), None);
        // Capacity exactly full, and zero counts anywhere.
        let r = rows((&[0, 0], &[0, 0]), (&[0, 0], &[0, 0]));
        assert_eq!(fault(&r, &[0, 0], (0, 0)), None);
    }

    #[test]
    fn each_misfit_is_named_with_its_numbers() {
        let past = rows((&[0, 2], &[2, 1]), (&[0, 3], &[3, 1]));
        let why = fault(&past, &[3, 1], (3, 3)).unwrap();
        assert!(why.contains("receive block of rank 1 (rows 3 to 4) ends past the result's 3 rows"));
        let negative = rows((&[0, 0], &[-1, 0]), (&[0, 0], &[0, 0]));
        let why = fault(&negative, &[0, 0], (3, 3)).unwrap();
        assert!(why.contains("send block of rank 0 has offset 0 and count -1"));
        let operand = rows((&[0, 2], &[2, 2]), (&[0, 0], &[0, 0]));
        let why = fault(&operand, &[0, 0], (3, 3)).unwrap();
        assert!(why.contains("ends past the operand's 3 rows"));
        let disagree = rows((&[0, 0], &[0, 0]), (&[0, 2], &[2, 1]));
        let why = fault(&disagree, &[2, 3], (3, 3)).unwrap();
        assert!(why.contains("rank 1 sends 3 rows here, but this rank expects 1"));
        let overlapping = rows((&[0, 0], &[0, 0]), (&[1, 0], &[2, 2]));
        let why = fault(&overlapping, &[2, 2], (3, 3)).unwrap();
        assert!(why.contains("rank 1 (rows 0 to 2) and rank 0 (rows 1 to 3) overlap"));
    }
}
