//! An allreduce of one of jaxmpi's own ops made as MPICH makes it for a predefined op:
//! reduce-scatter, then allgather, so that each rank combines only its share of the
//! vector. MPICH gives a user-defined op recursive doubling instead, in which every rank
//! combines the whole vector (`Quirks::user_op_allreduce_by_recursive_doubling`): float
//! MIN/MAX, which propagate NaN through jaxmpi's own op, cost 1.08-1.10x a SUM at 1 Mi
//! and 4 Mi elements on 2 ranks, where this ring costs 0.86-0.88x (benches/RESULTS.md,
//! issue 58). MPI's own reduce-scatter and allgather cannot do it for the same price: MPICH
//! copies the whole vector for a user-defined op's reduce-scatter.
//!
//! The exchanges are point to point on a communicator of jaxmpi's own, duplicated once per
//! communicator and kept as an attribute of it (freed with it), so that no receive of the
//! program's (any tag, any source) can take them.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};

use jaxmpi_core::{Input, Result};

use super::abi::{Abi, RawStatus};
use super::library::MpiLibrary;

thread_local! {
    /// Where an in-place ring receives a block before combining it, kept for the thread's
    /// next call (at most a chunk divided by the ranks): allocating it anew would fault
    /// its pages in on every call.
    static BLOCK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The blocks the ring cuts `count` elements into, one per rank: (first element, elements).
struct Blocks {
    count: usize,
    ranks: usize,
}

impl Blocks {
    fn block(&self, i: usize) -> (usize, usize) {
        let (base, extra) = (self.count / self.ranks, self.count % self.ranks);
        (i * base + i.min(extra), base + usize::from(i < extra))
    }
}

/// `recv = op over the ranks of send` (or of `recv` in place) on `comm`, `count` elements
/// of the predefined datatype `datatype` of `width` bytes; `op` one of jaxmpi's own ops.
/// Every step is made even after one fails, so that no partner waits for a message that
/// never comes; the first failure is returned.
pub(super) fn allreduce<A: Abi>(
    lib: &MpiLibrary<A>,
    comm: A::Handle,
    send: &Input,
    recv: *mut c_void,
    count: usize,
    (datatype, width): (A::Handle, usize),
    op: A::Handle,
) -> Result<()> {
    let inner = lib.private_duplicate(comm)?;
    let ranks = lib.size_of(inner)?;
    let rank = lib.comm_rank_raw(inner)? as usize;
    let blocks = Blocks { count, ranks };
    let (right, left) = ((rank + 1) % ranks, (rank + ranks - 1) % ranks);
    let in_place = matches!(send, Input::InPlace);
    let data: *const c_void = match send {
        Input::InPlace => recv.cast_const(),
        Input::Data(buf) => buf.ptr().cast(),
    };
    let at = |base: *const c_void, block: usize| -> (*mut c_void, c_int) {
        let (first, n) = blocks.block(block);
        let p = base
            .cast::<u8>()
            .wrapping_add(first * width)
            .cast_mut()
            .cast();
        (p, n as c_int) // a chunk's count fits an int
    };
    let exchange = |send: (*mut c_void, c_int), into: (*mut c_void, c_int)| -> Result<()> {
        let mut status = RawStatus::default();
        // SAFETY: both spans lie within buffers of `count` elements (or the scratch block),
        // and do not overlap; the ranks agree on every block's length.
        let rc = unsafe {
            (lib.fns.MPI_Sendrecv)(
                send.0,
                send.1,
                datatype,
                right as c_int,
                0,
                into.0,
                into.1,
                datatype,
                left as c_int,
                0,
                inner,
                status.as_mut_ptr(),
            )
        };
        lib.check("MPI_Sendrecv", rc)
    };
    let combine = |from: *const c_void, (into, n): (*mut c_void, c_int)| -> Result<()> {
        // SAFETY: `from` and `into` each hold `n` elements and do not overlap.
        let rc = unsafe { (lib.fns.MPI_Reduce_local)(from, into, n, datatype, op) };
        lib.check("MPI_Reduce_local", rc)
    };
    let mut first_failure = None;
    let mut note = |step: Result<()>| {
        if let Err(err) = step {
            first_failure.get_or_insert(err);
        }
    };
    BLOCK.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let words = (blocks.block(0).1 * width).div_ceil(8);
        if in_place && scratch.len() < words {
            scratch.resize(words, 0);
        }
        let scratch: *mut c_void = scratch.as_mut_ptr().cast();
        // Reduce-scatter: at step k a rank passes on block rank - k (its own data at
        // first, then what it combined the step before) and combines block rank - k - 1
        // with what its left neighbour passed on; after ranks - 1 steps it holds block
        // rank + 1 reduced over every rank.
        for k in 0..ranks - 1 {
            let (out, into) = (
                (rank + ranks - k) % ranks,
                (rank + 2 * ranks - k - 1) % ranks,
            );
            let sent = at(if k == 0 { data } else { recv.cast_const() }, out);
            let (target, n) = at(recv, into);
            if in_place {
                note(exchange(sent, (scratch, n)));
                note(combine(scratch, (target, n)));
            } else {
                // Received where the result goes, then combined with this rank's data.
                note(exchange(sent, (target, n)));
                note(combine(at(data, into).0, (target, n)));
            }
        }
        // Allgather: each step passes on the reduced block received the step before.
        for k in 0..ranks - 1 {
            let (out, into) = ((rank + 1 + ranks - k) % ranks, (rank + ranks - k) % ranks);
            note(exchange(at(recv, out), at(recv, into)));
        }
    });
    first_failure.map_or(Ok(()), Err)
}

/// The attribute value: the private duplicate, freed by `free_duplicate` when MPI deletes
/// the attribute (the communicator freed, or MPI finalized).
type Duplicate<H> = Box<H>;

/// MPI_Comm_copy_attr_function that copies nothing: a duplicate of a communicator makes
/// its own private duplicate when it needs one (MPI_COMM_NULL_COPY_FN, written here
/// because Open MPI's is a symbol, not NULL).
unsafe extern "C" fn copy_nothing<H>(
    _old: H,
    _keyval: c_int,
    _extra: *mut c_void,
    _value_in: *mut c_void,
    _value_out: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    // SAFETY: MPI passes a writable flag.
    unsafe { *flag = 0 };
    0
}

/// MPI_Comm_delete_attr_function: frees the private duplicate; `extra` is the library's
/// MPI_Comm_free.
unsafe extern "C" fn free_duplicate<H>(
    _comm: H,
    _keyval: c_int,
    value: *mut c_void,
    extra: *mut c_void,
) -> c_int {
    // SAFETY: `value` is the `Duplicate` `private_duplicate` leaked into the attribute,
    // deleted once; `extra` is the MPI_Comm_free pointer given at the keyval's creation.
    unsafe {
        let mut duplicate: H = *Box::from_raw(value.cast::<H>());
        let free: unsafe extern "C" fn(*mut H) -> c_int = std::mem::transmute(extra);
        free(&mut duplicate)
    }
}

impl<A: Abi> MpiLibrary<A> {
    /// The private duplicate of `comm` (`MPI_Comm_dup` the first time, a collective call
    /// every rank of `comm` makes at the same op, then an attribute lookup).
    fn private_duplicate(&self, comm: A::Handle) -> Result<A::Handle> {
        let keyval = self.private_duplicate_keyval()?;
        let (mut value, mut found): (*mut c_void, c_int) = (std::ptr::null_mut(), 0);
        // SAFETY: `value` receives the attribute's pointer, `found` the flag.
        let rc = unsafe {
            (self.fns.MPI_Comm_get_attr)(
                comm,
                keyval,
                (&mut value as *mut *mut c_void).cast(),
                &mut found,
            )
        };
        self.check("MPI_Comm_get_attr", rc)?;
        if found != 0 {
            // SAFETY: the attribute holds a `Duplicate` until MPI deletes it.
            return Ok(unsafe { *value.cast::<A::Handle>() });
        }
        let mut duplicate = self.pre.comm_null;
        // SAFETY: a valid communicator and a writable handle.
        self.check("MPI_Comm_dup", unsafe {
            (self.fns.MPI_Comm_dup)(comm, &mut duplicate)
        })?;
        let value: Duplicate<A::Handle> = Box::new(duplicate);
        let value = Box::into_raw(value);
        // SAFETY: the attribute takes the box; `free_duplicate` frees both.
        let rc = unsafe { (self.fns.MPI_Comm_set_attr)(comm, keyval, value.cast()) };
        if let Err(err) = self.check("MPI_Comm_set_attr", rc) {
            // SAFETY: not taken by MPI: still ours.
            let mut duplicate = *unsafe { Box::from_raw(value) };
            // SAFETY: the duplicate made above, freed once.
            unsafe { (self.fns.MPI_Comm_free)(&mut duplicate) };
            return Err(err);
        }
        Ok(duplicate)
    }

    /// The keyval of private duplicates, created at the first one.
    fn private_duplicate_keyval(&self) -> Result<c_int> {
        if let Some(&keyval) = self.private_duplicates.get() {
            return Ok(keyval);
        }
        let mut keyval = 0;
        let copy: unsafe extern "C" fn(A::Handle, c_int, _, _, _, _) -> c_int = copy_nothing;
        let delete: unsafe extern "C" fn(A::Handle, c_int, _, _) -> c_int = free_duplicate;
        // SAFETY: the callbacks have the standard's prototypes with this family's handle;
        // `extra` is MPI_Comm_free, which `free_duplicate` calls.
        let rc = unsafe {
            (self.fns.MPI_Comm_create_keyval)(
                copy as *const c_void,
                delete as *const c_void,
                &mut keyval,
                self.fns.MPI_Comm_free as *mut c_void,
            )
        };
        self.check("MPI_Comm_create_keyval", rc)?;
        // Two threads racing here would each make a keyval; the one kept serves both.
        Ok(*self.private_duplicates.get_or_init(|| keyval))
    }
}

#[cfg(test)]
mod tests {
    use super::Blocks;

    #[test]
    fn blocks_cover_the_vector_once_the_first_ones_larger() {
        for (count, ranks) in [(10, 3), (9, 3), (2, 3), (1 << 20, 2), (7, 7)] {
            let blocks = Blocks { count, ranks };
            let mut next = 0;
            for i in 0..ranks {
                let (first, n) = blocks.block(i);
                assert_eq!(first, next, "{count} over {ranks}");
                assert!(n == count / ranks || n == count / ranks + 1);
                next += n;
            }
            assert_eq!(next, count);
        }
    }
}
