//! Counts above 2^31-1, handled in this one place (mpi4py's idea: callers are
//! count-agnostic, the library's capability picks how).
//!
//! The ops describe each buffer as a `Typed` (count and datatype) and call the
//! count-agnostic MPI functions of `count_agnostic.rs` (`mpi_send`, ...), which take 64-bit counts.
//! Each uses the classic MPI function when every count fits an `int` and the MPI-4 `_c`
//! function otherwise (`width`). A library
//! without `_c` functions still moves one buffer of any size: `typed` then describes it as
//! one element of a derived datatype. Per-rank counts of the v-ops have no such way out
//! and are refused. Reductions are cut into `int`-sized segments instead (`in_segments`):
//! exact for elementwise ops, user ops included.

use std::ffi::{c_int, c_void};

use jaxmpi_core::{Dtype, Error, Result};

use super::abi::Abi;
use super::functions::{Aint, Count, LargeCountFunctions};
use super::library::MpiLibrary;
use super::starting;

/// Largest count a classic (non-`_c`) MPI call takes.
pub const INT_MAX: usize = c_int::MAX as usize;
/// Elements per segment when a reduction is split to fit `int` counts, and per block of
/// the derived datatype that spans a large buffer.
pub const SEGMENT: usize = 1 << 30;

/// Which functions one call uses.
pub(super) enum Width<'a, H> {
    Int,
    Large(&'a LargeCountFunctions<H>),
}

/// A buffer as (count, datatype) for one MPI call; frees its derived type when dropped.
pub(super) struct Typed<'a, A: Abi> {
    pub count: Count,
    pub datatype: A::Handle,
    derived: bool,
    lib: &'a MpiLibrary<A>,
}

impl<A: Abi> Drop for Typed<'_, A> {
    fn drop(&mut self) {
        if self.derived {
            // SAFETY: a datatype this struct created and nobody else holds.
            unsafe { (self.lib.fns.MPI_Type_free)(&mut self.datatype) };
        }
    }
}

impl<A: Abi> MpiLibrary<A> {
    /// Classic functions when every count of the call fits an `int`, else the `_c` ones;
    /// refused when the library has none.
    pub(super) fn width(&self, counts: &[usize]) -> Result<Width<'_, A::Handle>> {
        if counts.iter().all(|&c| c <= INT_MAX) {
            return Ok(Width::Int);
        }
        self.starts_with_int_counts("large counts")?;
        match &self.large {
            Some(large) => Ok(Width::Large(large)),
            None => Err(Error::unsupported(
                "large counts",
                format!(
                    "counts or displacements above 2^31-1 need MPI-4 large-count functions, which {} does not have",
                    self.info.path.display()
                ),
            )),
        }
    }

    /// `count` elements of `dtype` as MPI arguments: the count itself unless it takes a
    /// `_c` function the library lacks (or, starting a request, any `_c` function: their
    /// non-blocking twins are not loaded), then one element of a derived datatype.
    pub(super) fn typed(&self, count: usize, dtype: Dtype) -> Result<Typed<'_, A>> {
        let basic = self.pre.datatype(dtype);
        let large = || self.large.is_some() && !starting::active();
        let (count, datatype, derived) = if count <= INT_MAX || large() {
            (count, basic, false)
        } else {
            (1, self.big_datatype(count, basic)?, true)
        };
        Ok(Typed {
            count: count as Count,
            datatype,
            derived,
            lib: self,
        })
    }

    /// One derived datatype spanning `count` contiguous elements (count > INT_MAX), for
    /// libraries without large-count functions: `SEGMENT`-sized blocks plus a remainder.
    fn big_datatype(&self, count: usize, basic: A::Handle) -> Result<A::Handle> {
        let size = self.element_size(basic)?;
        let (blocks, rest) = (count / SEGMENT, count % SEGMENT);
        let mut block = self.pre.datatype_null;
        let mut all_blocks = self.pre.datatype_null;
        // SAFETY: creating types from committed predefined/derived types; out-pointers valid.
        unsafe {
            self.check(
                "MPI_Type_contiguous",
                (self.fns.MPI_Type_contiguous)(SEGMENT as c_int, basic, &mut block),
            )?;
            let rc = (self.fns.MPI_Type_contiguous)(blocks as c_int, block, &mut all_blocks);
            (self.fns.MPI_Type_free)(&mut block);
            self.check("MPI_Type_contiguous", rc)?;
        }
        let mut whole = all_blocks;
        if rest > 0 {
            let lengths: [c_int; 2] = [1, rest as c_int];
            let displacements: [Aint; 2] = [0, (blocks * SEGMENT * size) as Aint];
            let types = [all_blocks, basic];
            // SAFETY: arrays of two entries each, as the count says.
            unsafe {
                let rc = (self.fns.MPI_Type_create_struct)(
                    2,
                    lengths.as_ptr(),
                    displacements.as_ptr(),
                    types.as_ptr(),
                    &mut whole,
                );
                (self.fns.MPI_Type_free)(&mut all_blocks);
                self.check("MPI_Type_create_struct", rc)?;
            }
        }
        // SAFETY: `whole` is a valid, uncommitted derived type.
        self.check("MPI_Type_commit", unsafe {
            (self.fns.MPI_Type_commit)(&mut whole)
        })?;
        Ok(whole)
    }

    /// Splits an elementwise reduction of `count` elements into calls of the MPI function
    /// `names` names (the blocking one and its non-blocking twin, for `call_or_start`) of at
    /// most `SEGMENT` elements (always at least one call, so every rank enters the
    /// collective). Exact for any op, user ops included, and needs no large-count
    /// functions. `call(send, recv, count, request)`: the twin when `request` is given.
    pub(super) fn in_segments(
        &self,
        names: starting::Names,
        count: usize,
        dtype: Dtype,
        send: *const c_void,
        recv: *mut c_void,
        mut call: impl FnMut(*const c_void, *mut c_void, c_int, Option<&mut A::Handle>) -> c_int,
    ) -> Result<()> {
        let in_place = send as usize == A::IN_PLACE;
        let mut start = 0;
        loop {
            let n = SEGMENT.min(count - start);
            let offset = start * dtype.size();
            let send_at = if in_place {
                send
            } else {
                send.cast::<u8>().wrapping_add(offset).cast()
            };
            let recv_at = recv.cast::<u8>().wrapping_add(offset).cast();
            self.call_or_start(names, None, |request| {
                call(send_at, recv_at, n as c_int, request)
            })?;
            start += n;
            if start >= count {
                return Ok(());
            }
        }
    }
}
