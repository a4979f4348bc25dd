//! How allreduce and bcast are cut into MPI calls, the same on every rank whatever memory
//! its buffer is in. Staging through host memory pipelines them in chunks (copying chunk
//! k+1 while MPI moves chunk k), so the host backend and the CUDA-aware path cut them the
//! same way: a rank that makes one call where another makes several would match its call
//! with a chunk of the other's, giving wrong data or a hang that nothing reports.

/// Large enough that per-call MPI and event costs vanish next to the copy, small enough
/// that a staging pipeline fills early (the first chunk's copy is never hidden).
pub const CHUNK_BYTES: usize = 4 << 20;

/// (first element, elements) of each chunk of `count` elements of `size` bytes, cut at
/// `chunk_bytes`; one empty chunk for an empty buffer, so the MPI call still happens (and
/// validates its arguments) on every rank.
pub fn chunks_of(count: usize, size: usize, chunk_bytes: usize) -> Vec<(usize, usize)> {
    spans(count, size, chunk_bytes).collect()
}

/// The same chunks, made as they are used: what a call of the host backend takes, which
/// must not allocate (it is on every op's path, at a few hundred ns a call).
pub fn spans(
    count: usize,
    size: usize,
    chunk_bytes: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let per_chunk = (chunk_bytes / size.max(1)).max(1);
    let starts = (0..count.max(1)).step_by(per_chunk);
    starts.map(move |start| (start, per_chunk.min(count.saturating_sub(start))))
}

/// The chunks of every rank's allreduce and bcast.
pub fn chunks(count: usize, size: usize) -> Vec<(usize, usize)> {
    chunks_of(count, size, CHUNK_BYTES)
}

/// Runs `call` on every chunk and returns the first failure, having made every chunk's
/// call: once a rank has made its first MPI call of an op, a failure (here, or on another
/// rank) must not leave the others waiting in a call it never makes, nor make its next op
/// meet their remaining chunks. Only a failure of the first chunk that came before MPI
/// was called (an argument refused, the same on every chunk) ends it at once.
pub fn each_chunk<'p>(
    pieces: impl IntoIterator<Item = &'p (usize, usize)>,
    call: impl FnMut(usize, usize) -> jaxmpi_core::Result<()>,
) -> jaxmpi_core::Result<()> {
    each_span(pieces.into_iter().copied(), call)
}

/// `each_chunk` over chunks made as they are used (`spans`).
pub fn each_span(
    pieces: impl Iterator<Item = (usize, usize)>,
    mut call: impl FnMut(usize, usize) -> jaxmpi_core::Result<()>,
) -> jaxmpi_core::Result<()> {
    let mut failure = None;
    for (i, (start, n)) in pieces.enumerate() {
        if let Err(err) = call(start, n) {
            if i == 0 && err.mpi_class().is_none() {
                return Err(err);
            }
            failure.get_or_insert(err);
        }
    }
    failure.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jaxmpi_core::Error;

    #[test]
    fn chunks_cover_the_buffer_once_and_an_empty_buffer_is_one_empty_call() {
        assert_eq!(chunks_of(10, 4, 16), vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(chunks_of(8, 4, 16), vec![(0, 4), (4, 4)]);
        assert_eq!(chunks_of(0, 4, 16), vec![(0, 0)]);
    }

    #[test]
    fn every_dtype_cuts_at_the_same_byte_offsets() {
        // (3 << 20) + 5 float32: three whole chunks and a tail of 5 elements.
        let f32s = chunks((3 << 20) + 5, 4);
        assert_eq!(f32s.len(), 4);
        assert_eq!(f32s[3], (3 << 20, 5));
        for size in [1, 2, 4, 8, 16] {
            let pieces = chunks(CHUNK_BYTES / size * 2 + 1, size);
            assert_eq!(pieces.len(), 3, "{size}-byte elements");
            assert!(pieces.iter().all(|&(_, n)| n * size <= CHUNK_BYTES));
        }
    }

    #[test]
    fn a_failure_after_the_first_call_still_makes_every_call() {
        let mut made = Vec::new();
        let err = each_chunk(&chunks_of(10, 1, 2), |start, _| {
            made.push(start);
            if start == 2 {
                return Err(Error::mpi("MPI_Allreduce", 15, "truncated"));
            }
            if start == 6 {
                return Err(Error::library("cuda", "copy failed"));
            }
            Ok(())
        })
        .unwrap_err();
        assert_eq!(made, [0, 2, 4, 6, 8]);
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn an_argument_refused_at_the_first_chunk_ends_it_at_once() {
        let mut made = 0;
        let err = each_chunk(&chunks_of(10, 1, 2), |_, _| {
            made += 1;
            Err(Error::invalid_argument("root", "root 5 is not a rank"))
        })
        .unwrap_err();
        assert_eq!(made, 1);
        assert!(err.to_string().contains("root 5"), "{err}");
        // An MPI failure at the first chunk does not: the call was made.
        let mut made = 0;
        let _ = each_chunk(&chunks_of(10, 1, 2), |_, _| {
            made += 1;
            Err(Error::mpi("MPI_Bcast", 15, "truncated"))
        });
        assert_eq!(made, 5);
    }
}
