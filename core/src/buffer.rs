//! Buffers as a backend sees them: a typed, counted view of memory it may read or write.
//!
//! The unsafety of raw memory is paid once, where a buffer is made from a raw pointer (the
//! XLA handler, which got it from XLA); everything downstream is safe to call.

use std::marker::PhantomData;
use std::ops::Deref;

use crate::{Dtype, Error, Result};

/// How much a buffer holds: `count` elements of `dtype`. Both kinds of buffer deref to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    count: usize,
    dtype: Dtype,
}

impl Extent {
    pub fn count(&self) -> usize {
        self.count
    }
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    pub fn len_bytes(&self) -> usize {
        self.count * self.dtype.size()
    }
}

/// Memory a backend may read: `count` elements of `dtype` starting at `ptr`.
#[derive(Clone, Copy, Debug)]
pub struct Buf<'a> {
    ptr: *const u8,
    extent: Extent,
    _borrow: PhantomData<&'a [u8]>,
}

/// Memory a backend may write (and, for in/out arguments such as bcast's, read).
#[derive(Debug)]
pub struct BufMut<'a> {
    ptr: *mut u8,
    extent: Extent,
    _borrow: PhantomData<&'a mut [u8]>,
}

/// The send side of a reduction: separate data, or MPI_IN_PLACE (the input already sits
/// in the receive buffer, e.g. when XLA aliases an op's output to its input).
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    Data(Buf<'a>),
    InPlace,
}

impl<'a> Input<'a> {
    /// Elements `start..start + n` of the data (in place stays in place: the receive
    /// buffer's part is the input).
    pub fn part(&self, start: usize, n: usize) -> Input<'a> {
        match self {
            Input::Data(buf) => Input::Data(buf.part(start, n)),
            Input::InPlace => Input::InPlace,
        }
    }
}

fn whole_elements(len: usize, dtype: Dtype) -> Result<usize> {
    if !len.is_multiple_of(dtype.size()) {
        return Err(Error::invalid_argument(
            "buffer",
            format!(
                "{len} bytes is not a whole number of {dtype} elements ({} bytes each)",
                dtype.size()
            ),
        ));
    }
    Ok(len / dtype.size())
}

impl<'a> Buf<'a> {
    /// Views `bytes` as elements of `dtype`.
    pub fn from_bytes(bytes: &'a [u8], dtype: Dtype) -> Result<Self> {
        let count = whole_elements(bytes.len(), dtype)?;
        Ok(Buf {
            ptr: bytes.as_ptr(),
            extent: Extent { count, dtype },
            _borrow: PhantomData,
        })
    }

    /// # Safety
    /// `ptr` must be valid for reads of `count * dtype.size()` bytes for `'a`, or `count`
    /// must be 0 (then `ptr` may be null).
    pub unsafe fn from_raw(ptr: *const u8, count: usize, dtype: Dtype) -> Self {
        Buf {
            ptr,
            extent: Extent { count, dtype },
            _borrow: PhantomData,
        }
    }

    pub fn ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Elements `start..start + n` (clamped to the buffer).
    pub fn part(&self, start: usize, n: usize) -> Buf<'a> {
        let start = start.min(self.count());
        let n = n.min(self.count() - start);
        // SAFETY: a part of this buffer, readable for as long.
        unsafe {
            Buf::from_raw(
                self.ptr.wrapping_add(start * self.dtype().size()),
                n,
                self.dtype(),
            )
        }
    }
}

impl Deref for Buf<'_> {
    type Target = Extent;
    fn deref(&self) -> &Extent {
        &self.extent
    }
}

impl<'a> BufMut<'a> {
    /// Views `bytes` as elements of `dtype`.
    pub fn from_bytes(bytes: &'a mut [u8], dtype: Dtype) -> Result<Self> {
        let count = whole_elements(bytes.len(), dtype)?;
        Ok(BufMut {
            ptr: bytes.as_mut_ptr(),
            extent: Extent { count, dtype },
            _borrow: PhantomData,
        })
    }

    /// # Safety
    /// `ptr` must be valid for reads and writes of `count * dtype.size()` bytes for `'a`
    /// and not be accessed through any other path meanwhile, or `count` must be 0.
    pub unsafe fn from_raw(ptr: *mut u8, count: usize, dtype: Dtype) -> Self {
        BufMut {
            ptr,
            extent: Extent { count, dtype },
            _borrow: PhantomData,
        }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Elements `start..start + n` (clamped to the buffer), borrowed from it.
    pub fn part(&mut self, start: usize, n: usize) -> BufMut<'_> {
        let start = start.min(self.count());
        let n = n.min(self.count() - start);
        // SAFETY: a part of this buffer, which is borrowed mutably while it lives.
        unsafe {
            BufMut::from_raw(
                self.ptr.wrapping_add(start * self.dtype().size()),
                n,
                self.dtype(),
            )
        }
    }

    /// The elements from `start` on (none if `start` is past the end).
    pub fn tail(self, start: usize) -> BufMut<'a> {
        let start = start.min(self.count());
        let offset = start * self.dtype().size();
        // SAFETY: the part of this buffer (which is consumed) from `start` on.
        unsafe {
            BufMut::from_raw(
                self.ptr.wrapping_add(offset),
                self.count() - start,
                self.dtype(),
            )
        }
    }
}

impl Deref for BufMut<'_> {
    type Target = Extent;
    fn deref(&self) -> &Extent {
        &self.extent
    }
}

/// bcast's buffer on one rank.
#[derive(Debug)]
pub enum Broadcast<'a> {
    /// The root's message, only read (it may be an XLA input).
    Root(Buf<'a>),
    /// Where a rank other than the root receives.
    Receiver(BufMut<'a>),
    /// One buffer on every rank, as MPI_Bcast takes it: the message at the root, where the
    /// message arrives elsewhere. For a body that binds the result on every rank (one
    /// program for every rank, the root's result aliasing its message), so that it need not
    /// ask the communicator which rank it is: the backend learns that anyway.
    InPlace(BufMut<'a>),
}

impl Broadcast<'_> {
    /// Whether a rank that is (`at_root`) or is not the root may pass this buffer.
    pub fn fits(&self, at_root: bool) -> bool {
        match self {
            Broadcast::Root(_) => at_root,
            Broadcast::Receiver(_) => !at_root,
            Broadcast::InPlace(_) => true,
        }
    }

    /// Elements `start..start + n` (clamped), of the same kind.
    pub fn part(&mut self, start: usize, n: usize) -> Broadcast<'_> {
        match self {
            Broadcast::Root(buf) => Broadcast::Root(buf.part(start, n)),
            Broadcast::Receiver(buf) => Broadcast::Receiver(buf.part(start, n)),
            Broadcast::InPlace(buf) => Broadcast::InPlace(buf.part(start, n)),
        }
    }
}

impl Deref for Broadcast<'_> {
    type Target = Extent;
    fn deref(&self) -> &Extent {
        match self {
            Broadcast::Root(buf) => buf,
            Broadcast::Receiver(buf) | Broadcast::InPlace(buf) => buf,
        }
    }
}

/// Where each rank's block lies in a buffer of a variable-count collective: rank i's block
/// is `counts[i]` elements from element `displs[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Blocks<'a> {
    pub counts: &'a [usize],
    pub displs: &'a [usize],
}

impl Blocks<'_> {
    /// Checks that there is one block per rank of a communicator of `size` ranks and that
    /// every block lies inside a buffer of `buffer` elements (errors name the "counts").
    pub fn check(&self, size: usize, buffer: usize) -> Result<()> {
        let name = "counts";
        for (what, got) in [
            ("counts", self.counts.len()),
            ("displacements", self.displs.len()),
        ] {
            if got != size {
                return Err(Error::invalid_argument(
                    name,
                    format!("{what} has {got} elements but must have {size}"),
                ));
            }
        }
        for (rank, (&count, &displ)) in self.counts.iter().zip(self.displs).enumerate() {
            if count.saturating_add(displ) > buffer {
                return Err(Error::invalid_argument(
                    name,
                    format!(
                        "rank {rank}'s block (displacement {displ}, count {count}) ends past \
                         the buffer of {buffer} elements"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A buffer a variable-count collective reads, cut into per-rank blocks.
#[derive(Clone, Copy, Debug)]
pub struct Partition<'a> {
    pub buf: Buf<'a>,
    pub blocks: Blocks<'a>,
}

/// A buffer a variable-count collective writes, cut into per-rank blocks.
#[derive(Debug)]
pub struct PartitionMut<'a> {
    pub buf: BufMut<'a>,
    pub blocks: Blocks<'a>,
}

impl<'a> Partition<'a> {
    pub fn new(buf: Buf<'a>, counts: &'a [usize], displs: &'a [usize]) -> Self {
        Partition {
            buf,
            blocks: Blocks { counts, displs },
        }
    }
    /// `Blocks::check` against this buffer.
    pub fn check(&self, size: usize) -> Result<()> {
        self.blocks.check(size, self.buf.count())
    }
}

impl<'a> PartitionMut<'a> {
    pub fn new(buf: BufMut<'a>, counts: &'a [usize], displs: &'a [usize]) -> Self {
        PartitionMut {
            buf,
            blocks: Blocks { counts, displs },
        }
    }
    /// `Blocks::check` against this buffer.
    pub fn check(&self, size: usize) -> Result<()> {
        self.blocks.check(size, self.buf.count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_bytes_counts_elements_and_refuses_partial_ones() {
        let data = [0u8; 12];
        let buf = Buf::from_bytes(&data, Dtype::F32).unwrap();
        assert_eq!((buf.count(), buf.len_bytes()), (3, 12));
        let err = Buf::from_bytes(&data[..10], Dtype::F64).unwrap_err();
        assert!(err
            .to_string()
            .contains("10 bytes is not a whole number of float64"));
        let mut out = [0u8; 32];
        assert_eq!(
            BufMut::from_bytes(&mut out, Dtype::C128).unwrap().count(),
            2
        );
    }

    #[test]
    fn blocks_need_one_entry_per_rank_inside_the_buffer() {
        let data = [0u8; 16];
        let buf = Buf::from_bytes(&data, Dtype::F32).unwrap();
        assert!(Partition::new(buf, &[1, 3], &[0, 1]).check(2).is_ok());
        let short = Partition::new(buf, &[1], &[0]).check(2).unwrap_err();
        assert!(short
            .to_string()
            .contains("counts has 1 elements but must have 2"));
        let past = Partition::new(buf, &[1, 3], &[0, 2]).check(2).unwrap_err();
        assert!(past
            .to_string()
            .contains("rank 1's block (displacement 2, count 3) ends past"));
    }
}
