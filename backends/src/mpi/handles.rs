//! Conversions between jaxmpi's values and the library's handles and integers, and the
//! argument checks the ops share. Each check names itself in its error ("communicator",
//! "root", "buffers", ...), as each MPI call names its function: the handler adds the op.

use std::ffi::{c_char, c_int, c_void};

use jaxmpi_core::{
    Buf, BufMut, Comm, Dtype, Error, Input, NativeStatus, Peer, ReduceOp, Result, Status,
};

use super::abi::{Abi, RawStatus};
use super::library::{c_string, MpiLibrary};
use super::own_reductions;

const MPI_UNDEFINED: c_int = -32766;

/// The communicator of a rooted op (bcast, reduce, gather, scatter and their v forms).
pub(super) struct RootedComm<H> {
    pub handle: H,
    pub size: usize,
    /// Whether this rank is the root: the one whose buffers hold every rank's blocks.
    pub at_root: bool,
}

impl<A: Abi> MpiLibrary<A> {
    pub(super) fn comm_rank_raw(&self, comm: A::Handle) -> Result<i32> {
        let mut rank = 0;
        // SAFETY: `comm` passed the family's handle checks; writes one int.
        let rc = unsafe { (self.fns.MPI_Comm_rank)(comm, &mut rank) };
        self.check("MPI_Comm_rank", rc).map(|()| rank)
    }

    pub(super) fn comm_size_raw(&self, comm: A::Handle) -> Result<i32> {
        let mut size = 0;
        // SAFETY: as for comm_rank_raw.
        let rc = unsafe { (self.fns.MPI_Comm_size)(comm, &mut size) };
        self.check("MPI_Comm_size", rc).map(|()| size)
    }

    /// The library's handle for `comm`, after the checks that cost nothing.
    pub(super) fn comm(&self, comm: Comm) -> Result<A::Handle> {
        let handle = A::handle_from_raw(comm.0).map_err(|why| {
            Error::invalid_argument(
                "communicator",
                format!(
                    "communicator {why}. The loaded MPI is {} ({}): pass a communicator of that library",
                    A::FAMILY,
                    self.info.path.display()
                ),
            )
        })?;
        if handle == self.pre.comm_null {
            return Err(Error::invalid_argument(
                "communicator",
                "the communicator is MPI_COMM_NULL",
            ));
        }
        Ok(handle)
    }

    pub(super) fn to_comm(&self, handle: A::Handle) -> Comm {
        Comm(A::handle_to_raw(handle))
    }

    /// The op handle for `op` on `dtype`, refusing pairs MPI does not define.
    pub(super) fn op(&self, op: ReduceOp, dtype: Dtype) -> Result<A::Handle> {
        let name = "reduction op";
        if !op.supports(dtype) {
            return Err(Error::invalid_argument(
                name,
                format!("{op} is not defined on {dtype}; use an op valid for the dtype"),
            ));
        }
        if let ReduceOp::User(raw) = op {
            return A::handle_from_raw(raw)
                .map_err(|why| Error::invalid_argument(name, format!("op {why}")));
        }
        match (self.own_op(op, dtype), self.pre.op(op)) {
            (Some(handle), _) => Ok(handle),
            (None, Some(handle)) if !dtype.is_half() => Ok(handle),
            _ => Err(Error::unsupported(
                name,
                format!("{op} on {dtype} is not available"),
            )),
        }
    }

    /// MPI's integer for a peer rank.
    pub(super) fn peer(&self, peer: Peer, is_source: bool) -> Result<c_int> {
        match peer {
            Peer::Rank(rank) => Ok(rank),
            Peer::Null => Ok(A::PROC_NULL),
            Peer::Any if is_source => Ok(A::ANY_SOURCE),
            Peer::Any => Err(Error::invalid_argument(
                "peer",
                "ANY_SOURCE is not a valid destination",
            )),
        }
    }

    pub(super) fn tag(&self, tag: Option<i32>) -> c_int {
        tag.unwrap_or(A::ANY_TAG)
    }

    pub(super) fn element_size(&self, datatype: A::Handle) -> Result<usize> {
        let mut size = 0;
        // SAFETY: a predefined datatype; writes one int.
        self.check("MPI_Type_size", unsafe {
            (self.fns.MPI_Type_size)(datatype, &mut size)
        })?;
        Ok(size as usize)
    }

    /// Elements of `dtype` a completed receive delivered.
    pub(super) fn received(&self, status: &mut RawStatus, dtype: Dtype) -> Result<usize> {
        let mut count = 0;
        // SAFETY: a status filled by the receive that just completed.
        let rc = unsafe {
            (self.fns.MPI_Get_elements_x)(status.as_mut_ptr(), self.pre.datatype(dtype), &mut count)
        };
        self.check("MPI_Get_elements_x", rc)?;
        if count == MPI_UNDEFINED as i64 {
            return Err(Error::mpi(
                "MPI_Get_elements_x",
                0,
                "the received message is not a whole number of elements",
            ));
        }
        Ok(count as usize)
    }

    /// jaxmpi's own op for `op` on `dtype` on this library, where it brings one.
    pub(super) fn own_op(&self, op: ReduceOp, dtype: Dtype) -> Option<A::Handle> {
        if !own_reductions::may_be_own(dtype, op) {
            return None;
        }
        self.own_reductions
            .iter()
            .find(|&&(d, o, _)| d == dtype && o == op)
            .map(|&(_, _, handle)| handle)
    }

    /// The send pointer of a reduction: MPI_IN_PLACE or the data.
    pub(super) fn input_ptr(&self, input: &Input) -> *const c_void {
        match input {
            Input::InPlace => A::IN_PLACE as *const c_void,
            Input::Data(buf) => buf.ptr().cast(),
        }
    }

    pub(super) fn name_of(&self, datatype: A::Handle) -> String {
        let mut buffer = vec![0 as c_char; 256];
        let mut len = 0;
        // SAFETY: the buffer exceeds MPI_MAX_OBJECT_NAME in every family.
        unsafe { (self.fns.MPI_Type_get_name)(datatype, buffer.as_mut_ptr(), &mut len) };
        c_string(&buffer, len)
    }

    /// The number of ranks of `comm`, as a count.
    pub(super) fn size_of(&self, comm: A::Handle) -> Result<usize> {
        Ok(self.comm_size_raw(comm)? as usize)
    }

    /// `comm` as an op rooted at `root` needs it, refused if `root` is none of its ranks.
    pub(super) fn rooted_comm(&self, comm: Comm, root: i32) -> Result<RootedComm<A::Handle>> {
        let handle = self.comm(comm)?;
        let size = self.size_of(handle)?;
        if root < 0 || root as usize >= size {
            return Err(Error::invalid_argument(
                "root",
                format!("root {root} is out of range for a communicator of {size} ranks"),
            ));
        }
        let at_root = self.comm_rank_raw(handle)? == root;
        Ok(RootedComm {
            handle,
            size,
            at_root,
        })
    }

    /// A completed receive's status as jaxmpi reports it.
    /// `dtype`: the receive buffer's, what the count is in.
    pub(super) fn status(&self, status: &mut RawStatus, dtype: Dtype) -> Result<Status> {
        let source = status.field(A::STATUS_SOURCE);
        let source = if source == A::PROC_NULL {
            Peer::Null
        } else {
            Peer::Rank(source)
        };
        Ok(Status {
            source,
            tag: (source != Peer::Null).then(|| status.field(A::STATUS_TAG)),
            error: status.field(A::STATUS_ERROR),
            count: self.received(status, dtype)?,
            native: NativeStatus {
                bytes: status.bytes(),
                len: A::STATUS_SIZE,
            },
        })
    }
}

/// What the buffer checks name themselves in errors.
const BUFFERS: &str = "buffers";

/// Checks that two buffers of one op agree on dtype.
pub(super) fn same_dtype(send: &Buf, recv: &BufMut) -> Result<()> {
    if send.dtype() != recv.dtype() {
        return Err(Error::invalid_argument(
            BUFFERS,
            format!(
                "send buffer is {} but receive buffer is {}",
                send.dtype(),
                recv.dtype()
            ),
        ));
    }
    Ok(())
}

pub(super) fn expect_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::invalid_argument(
            BUFFERS,
            format!("{what} has {got} elements but must have {want}"),
        ));
    }
    Ok(())
}
