//! Checked mode before a collective: every rank's call as a fixed-size record (op, dtype,
//! count, root, reduction, the v-ops' counts, communicator size, pytree), gathered by one
//! allgather on the call's communicator, so that every rank sees the same records and a
//! mismatch fails every rank alike, naming what each passed.

use std::fmt;

use super::{dtype_index, tree_name, STEP};
use crate::xla::frame::Call;
use crate::xla::handlers::SIGNATURES;
use crate::{Buf, BufMut, Comm, Dtype, Error, Library, Result};

/// One rank's call of a collective, as the ranks compare it (fixed size: it travels in one
/// allgather). Numbers that do not apply are -1 (0 for the counts of a plain collective).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    op: i32,
    dtype: i32,
    /// Elements of the buffer every rank passes alike (for the v-ops: of one row).
    count: u64,
    root: i32,
    reduce_op: i32,
    comm_size: i32,
    /// The v-ops' per-rank counts: their total and a hash of all of them.
    counts_total: u64,
    counts_hash: u64,
    /// The fingerprint of the pytree the buffer packs (0: a single array).
    tree: u64,
}

const RECORD_BYTES: usize = 56;

impl Record {
    fn to_bytes(self) -> [u8; RECORD_BYTES] {
        let mut out = [0u8; RECORD_BYTES];
        let words: [i64; 7] = [
            i64::from(self.op) << 32 | i64::from(self.dtype as u32),
            self.count as i64,
            i64::from(self.root) << 32 | i64::from(self.reduce_op as u32),
            i64::from(self.comm_size),
            self.counts_total as i64,
            self.counts_hash as i64,
            self.tree as i64,
        ];
        for (chunk, word) in out.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    fn from_bytes(bytes: &[u8]) -> Record {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            i64::from_le_bytes(w)
        };
        Record {
            op: (word(0) >> 32) as i32,
            dtype: word(0) as i32,
            count: word(1) as u64,
            root: (word(2) >> 32) as i32,
            reduce_op: word(2) as i32,
            comm_size: word(3) as i32,
            counts_total: word(4) as u64,
            counts_hash: word(5) as u64,
            tree: word(6) as u64,
        }
    }
}

/// "allreduce float32[4] SUM", "gatherv float32 rows of 3, counts of 7 rows, root 1".
impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Past the ops, their started forms (`record`).
        let all = SIGNATURES.len();
        let op = usize::try_from(self.op)
            .ok()
            .and_then(|i| match i.checked_sub(all) {
                None => SIGNATURES.get(i).map(|s| s.name),
                Some(started) => SIGNATURES.get(started).map(|s| s.started),
            });
        let op = op.unwrap_or("an unknown op");
        let dtype = Dtype::ALL
            .get(self.dtype as usize)
            .map_or("?", |d| d.name());
        if self.dtype < 0 {
            write!(f, "{op}")?;
        } else if self.counts_hash != 0 {
            write!(
                f,
                "{op} {dtype} rows of {}, counts of {} rows in all",
                self.count, self.counts_total
            )?;
        } else {
            write!(f, "{op} {dtype}[{}]", self.count)?;
        }
        if self.root >= 0 {
            write!(f, " root {}", self.root)?;
        }
        match self.reduce_op {
            -1 => {}
            -2 => f.write_str(" user-defined op")?,
            i => write!(
                f,
                " {}",
                crate::ReduceOp::PREDEFINED
                    .get(i as usize)
                    .map_or("?", |op| op.name())
            )?,
        }
        write!(f, " on {} ranks", self.comm_size)?;
        if self.tree != 0 {
            write!(f, ", {}", tree_name(self.tree))?;
        }
        Ok(())
    }
}

/// FNV-1a over the counts: equal vectors give equal hashes; 0 is kept for "no counts".
fn hash(values: &[i64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in values {
        for byte in v.to_le_bytes() {
            h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h.max(1)
}

/// What this rank calls, as the ranks compare it. The buffer compared is the one every
/// rank passes alike: the operand, except where only the root has it (bcast's and
/// scatter's receivers compare their result); the v-ops compare a row and their counts.
fn record(call: &Call, comm_size: i32) -> Result<Record> {
    // A started op's call is told from its op's (the ranks must not mix them), and
    // moves what its op's does.
    let position = SIGNATURES.iter().position(|s| s.name == call.name());
    let started = SIGNATURES.iter().position(|s| s.started == call.name());
    let op = match (position, started) {
        (Some(i), _) => i as i32,
        (None, Some(i)) => (SIGNATURES.len() + i) as i32,
        (None, None) => -1,
    };
    let name = started.map_or(call.name(), |i| SIGNATURES[i].name);
    let buffer = match name {
        "barrier" => None,
        "scatter" | "scatterv" => call.optional_ret(0),
        "bcast" => call.optional_ret(0).or(call.optional_arg(0)),
        _ => call.optional_arg(0),
    };
    let counts: Vec<i64> = ["counts", "send_counts", "recv_counts"]
        .iter()
        .filter_map(|attr| call.array_i64(attr).ok())
        .flatten()
        .copied()
        .collect();
    let is_vector = name.ends_with('v');
    let (dtype, count) = match &buffer {
        Some(b) => (
            dtype_index(b.dtype()?),
            if is_vector { b.row() } else { b.count() },
        ),
        None => (-1, 0),
    };
    let reduce_op = match call.optional_i64("op") {
        None => -1,
        Some(code) if code < 0 => -2,
        Some(code) => code as i32,
    };
    Ok(Record {
        op,
        dtype,
        count: count as u64,
        root: call.optional_i64("root").map_or(-1, |r| r as i32),
        reduce_op,
        comm_size,
        counts_total: if is_vector {
            counts.iter().sum::<i64>() as u64
        } else {
            0
        },
        counts_hash: if is_vector { hash(&counts) } else { 0 },
        tree: call.optional_i64("tree").unwrap_or(0) as u64,
    })
}

/// Before a collective: every rank of `comm` learns what the others call, and all of them
/// fail alike, naming each rank's call, if they differ.
pub(in crate::xla::handlers) fn collective(
    call: &Call,
    library: &dyn Library,
    comm: Comm,
) -> Result<()> {
    let size = library.comm_size(comm)?;
    let mine = record(call, size)?.to_bytes();
    let mut all = vec![0u8; RECORD_BYTES * size as usize];
    library.backend().allgather(
        comm,
        Buf::from_bytes(&mine, Dtype::U8)?,
        BufMut::from_bytes(&mut all, Dtype::U8)?,
    )?;
    let records: Vec<Record> = all
        .chunks_exact(RECORD_BYTES)
        .map(Record::from_bytes)
        .collect();
    if records.iter().all(|r| *r == records[0]) {
        return Ok(());
    }
    Err(Error::invalid_argument(
        STEP,
        format!(
            "the ranks do not make the same call: {}. Every rank must call the same \
             collective with the same dtype, size, root and reduction, and pass pytrees of \
             the same structure (leaf paths, dtypes and shapes)",
            by_rank(&records)
        ),
    ))
}

/// "ranks 0, 2: allreduce float32[4] SUM on 3 ranks; rank 1: allreduce int32[4] ...".
fn by_rank(records: &[Record]) -> String {
    let mut groups: Vec<(Record, Vec<usize>)> = Vec::new();
    for (rank, record) in records.iter().enumerate() {
        match groups.iter_mut().find(|(r, _)| r == record) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((*record, vec![rank])),
        }
    }
    let groups: Vec<String> = groups
        .iter()
        .map(|(record, ranks)| {
            let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
            let word = if ranks.len() == 1 { "rank" } else { "ranks" };
            format!("{word} {}: {record}", list.join(", "))
        })
        .collect();
    groups.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_the_wire_and_say_what_each_rank_called() {
        let a = Record {
            op: 0,
            dtype: dtype_index(Dtype::F32),
            count: 4,
            root: -1,
            reduce_op: 0,
            comm_size: 2,
            counts_total: 0,
            counts_hash: 0,
            tree: 0,
        };
        let b = Record {
            dtype: dtype_index(Dtype::I32),
            ..a
        };
        assert_eq!(Record::from_bytes(&a.to_bytes()), a);
        assert_eq!(
            by_rank(&[a, b, a]),
            "ranks 0, 2: allreduce float32[4] SUM on 2 ranks; \
             rank 1: allreduce int32[4] SUM on 2 ranks"
        );
        let c = Record { tree: 0xab, ..a };
        assert_eq!(Record::from_bytes(&c.to_bytes()), c);
        assert_eq!(
            by_rank(&[a, c]),
            "rank 0: allreduce float32[4] SUM on 2 ranks; \
             rank 1: allreduce float32[4] SUM on 2 ranks, pytree 00000000000000ab"
        );
    }
}
