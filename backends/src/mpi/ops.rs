//! The `Backend` implementation: every op written once for all families.
//!
//! Reductions are split into `int`-sized segments (exact for elementwise ops, and it works
//! with user ops and libraries without large counts). Data movement uses the MPI-4 `_c`
//! functions when the library has them and a derived datatype otherwise.

use std::ffi::{c_int, c_void};

use jaxmpi_core::{
    Backend, Buf, BufMut, Comm, Error, Input, LibraryInfo, NativeStatus, Peer, ReduceOp, Result,
    Status, ThreadLevel,
};

use super::abi::{Abi, RawStatus};
use super::functions::{Aint, Count};
use super::library::{same_dtype, Mode, MpiLibrary, INT_MAX};

/// Per-rank counts and displacements as the chosen mode passes them.
enum Layout {
    Int(Vec<c_int>, Vec<c_int>),
    Large(Vec<Count>, Vec<Aint>),
}

fn expect_len(op: &'static str, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::invalid_argument(
            op,
            format!("{what} has {got} elements but must have {want}"),
        ));
    }
    Ok(())
}

impl<A: Abi> MpiLibrary<A> {
    fn size_of(&self, op: &'static str, comm: A::Handle) -> Result<usize> {
        let size = self
            .comm_size_raw(comm)
            .map_err(|e| Error { op: op.into(), ..e })?;
        Ok(size as usize)
    }

    fn check_root(&self, op: &'static str, root: i32, size: usize) -> Result<()> {
        if root < 0 || root as usize >= size {
            return Err(Error::invalid_argument(
                op,
                format!("root {root} is out of range for a communicator of {size} ranks"),
            ));
        }
        Ok(())
    }

    /// Validates per-rank counts/displacements against a buffer and converts them.
    fn layout(
        &self,
        op: &'static str,
        mode: &Mode<A::Handle>,
        counts: &[usize],
        displs: &[usize],
        size: usize,
        buffer: usize,
    ) -> Result<Layout> {
        expect_len(op, "counts", counts.len(), size)?;
        expect_len(op, "displacements", displs.len(), size)?;
        for (rank, (&count, &displ)) in counts.iter().zip(displs).enumerate() {
            if count + displ > buffer {
                return Err(Error::invalid_argument(
                    op,
                    format!("rank {rank}'s block (displacement {displ}, count {count}) ends past the buffer of {buffer} elements"),
                ));
            }
        }
        match mode {
            Mode::Large(_) => Ok(Layout::Large(
                counts.iter().map(|&c| c as Count).collect(),
                displs.iter().map(|&d| d as Aint).collect(),
            )),
            Mode::Int if counts.iter().chain(displs).all(|&v| v <= INT_MAX) => Ok(Layout::Int(
                counts.iter().map(|&c| c as c_int).collect(),
                displs.iter().map(|&d| d as c_int).collect(),
            )),
            Mode::Int => Err(Error::unsupported(
                op,
                format!(
                    "counts or displacements above 2^31-1 need MPI-4 large-count functions, which {} does not have",
                    self.info.path.display()
                ),
            )),
        }
    }

    /// Elementwise reductions share this: validate, then reduce in int-sized segments.
    fn reduction(
        &self,
        op_name: &'static str,
        comm: Comm,
        send: Input,
        recv: &BufMut,
        op: ReduceOp,
        call: impl FnMut(*const c_void, *mut c_void, c_int, A::Handle, A::Handle, A::Handle) -> c_int,
    ) -> Result<()> {
        let comm = self.comm(op_name, comm)?;
        if let Input::Data(buf) = &send {
            same_dtype(op_name, buf, recv)?;
            expect_len(op_name, "the receive buffer", recv.count(), buf.count())?;
        }
        self.reduce_raw(
            op_name,
            comm,
            self.input_ptr(&send),
            recv.ptr().cast(),
            recv.count(),
            recv.dtype(),
            op,
            call,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_raw(
        &self,
        op_name: &'static str,
        comm: A::Handle,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: jaxmpi_core::Dtype,
        op: ReduceOp,
        mut call: impl FnMut(
            *const c_void,
            *mut c_void,
            c_int,
            A::Handle,
            A::Handle,
            A::Handle,
        ) -> c_int,
    ) -> Result<()> {
        let datatype = self.pre.datatype(dtype);
        let op = self.op(op_name, op, dtype)?;
        self.in_segments(op_name, count, dtype, send, recv, |s, r, n| {
            call(s, r, n, datatype, op, comm)
        })
    }

    fn status(&self, op: &'static str, status: &mut RawStatus, recv: &BufMut) -> Result<Status> {
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
            count: self.received(op, status, recv.dtype())?,
            native: NativeStatus {
                bytes: status.bytes(),
                len: A::STATUS_SIZE,
            },
        })
    }
}

impl<A: Abi> Backend for MpiLibrary<A> {
    fn info(&self) -> &LibraryInfo {
        &self.info
    }
    fn thread_level(&self) -> ThreadLevel {
        self.thread_level
    }
    fn initialized_here(&self) -> bool {
        self.initialized_here
    }
    fn is_finalized(&self) -> bool {
        let mut finalized = 0;
        // SAFETY: may be called at any time; writes one int.
        unsafe { (self.fns.MPI_Finalized)(&mut finalized) };
        finalized != 0
    }
    fn finalize(&self) -> Result<()> {
        self.finalize_if_owned()
    }
    fn cuda_aware(&self) -> bool {
        self.cuda_aware.aware
    }
    fn cuda_aware_reason(&self) -> &str {
        &self.cuda_aware.reason
    }
    fn abort(&self, code: i32) -> ! {
        // SAFETY: MPI is initialized; MPI_Abort may be called from any thread.
        unsafe { (self.fns.MPI_Abort)(self.pre.comm_world, code) };
        // MPI_Abort is not supposed to return; if it does, this process ends at least.
        std::process::exit(code)
    }

    fn return_errors_on(&self, comm: Comm) -> Result<Option<usize>> {
        let op = "error handler check";
        let handle = self.comm(op, comm)?;
        let mut current = self.pre.errors_return;
        // SAFETY: a communicator handle of this family; writes one handle.
        self.check(op, unsafe {
            (self.fns.MPI_Comm_get_errhandler)(handle, &mut current)
        })?;
        if current == self.pre.errors_return {
            // SAFETY: get_errhandler returned a reference, which is released here.
            unsafe { (self.fns.MPI_Errhandler_free)(&mut current) };
            return Ok(None);
        }
        // SAFETY: as above; the reference taken is kept until `restore_errhandler`.
        self.check(op, unsafe {
            (self.fns.MPI_Comm_set_errhandler)(handle, self.pre.errors_return)
        })?;
        Ok(Some(A::handle_to_raw(current)))
    }

    fn restore_errhandler(&self, comm: Comm, handler: usize) {
        let (Ok(handle), Ok(mut handler)) =
            (A::handle_from_raw(comm.0), A::handle_from_raw(handler))
        else {
            return;
        };
        // SAFETY: the communicator and the handler reference `return_errors_on` took.
        unsafe {
            (self.fns.MPI_Comm_set_errhandler)(handle, handler);
            (self.fns.MPI_Errhandler_free)(&mut handler);
        }
    }

    fn world(&self) -> Comm {
        self.to_comm(self.pre.comm_world)
    }

    fn check_comm(&self, comm: Comm) -> Result<()> {
        let op = "communicator check";
        let handle = self.comm(op, comm)?;
        A::check_comm_object(&self.lib, handle).map_err(|why| Error::invalid_argument(op, why))?;
        let mut inter = 0;
        // SAFETY: `handle` has the shape of a communicator of this library (checked above);
        // MPI validates the object itself and, on a freed one, returns an error.
        self.check(op, unsafe {
            (self.fns.MPI_Comm_test_inter)(handle, &mut inter)
        })
        .map_err(|err| {
            Error::invalid_argument(
                op,
                format!(
                    "MPI does not accept the communicator (was it freed?): {}",
                    err.message
                ),
            )
        })?;
        if inter != 0 {
            return Err(Error::invalid_argument(
                op,
                "the communicator is an intercommunicator; jaxmpi ops need an intracommunicator",
            ));
        }
        Ok(())
    }

    fn comm_rank(&self, comm: Comm) -> Result<i32> {
        self.comm_rank_raw(self.comm("comm_rank", comm)?)
    }

    fn comm_size(&self, comm: Comm) -> Result<i32> {
        self.comm_size_raw(self.comm("comm_size", comm)?)
    }

    fn comm_dup(&self, comm: Comm) -> Result<Comm> {
        let op = "comm_dup";
        let handle = self.comm(op, comm)?;
        let mut copy = self.pre.comm_null;
        // SAFETY: a valid communicator and an out-pointer to one handle.
        self.check(op, unsafe { (self.fns.MPI_Comm_dup)(handle, &mut copy) })?;
        // SAFETY: `copy` is the communicator just created.
        self.check(op, unsafe {
            (self.fns.MPI_Comm_set_errhandler)(copy, self.pre.errors_return)
        })?;
        Ok(self.to_comm(copy))
    }

    fn comm_split(&self, comm: Comm, color: Option<i32>, key: i32) -> Result<Option<Comm>> {
        let op = "comm_split";
        let handle = self.comm(op, comm)?;
        if color.is_some_and(|c| c < 0) {
            return Err(Error::invalid_argument(
                op,
                "color must be non-negative (or None for MPI_UNDEFINED)",
            ));
        }
        let mut part = self.pre.comm_null;
        // SAFETY: a valid communicator and an out-pointer to one handle.
        let rc =
            unsafe { (self.fns.MPI_Comm_split)(handle, color.unwrap_or(-32766), key, &mut part) };
        self.check(op, rc)?;
        if part == self.pre.comm_null {
            return Ok(None);
        }
        // SAFETY: `part` is the communicator just created.
        self.check(op, unsafe {
            (self.fns.MPI_Comm_set_errhandler)(part, self.pre.errors_return)
        })?;
        Ok(Some(self.to_comm(part)))
    }

    fn comm_free(&self, comm: Comm) -> Result<()> {
        let op = "comm_free";
        let mut handle = self.comm(op, comm)?;
        if handle == self.pre.comm_world || handle == self.pre.comm_self {
            return Err(Error::invalid_argument(
                op,
                "predefined communicators cannot be freed",
            ));
        }
        // SAFETY: a user communicator; MPI sets the handle to COMM_NULL.
        self.check(op, unsafe { (self.fns.MPI_Comm_free)(&mut handle) })
    }

    fn node_local_rank(&self, comm: Comm) -> Result<(i32, i32)> {
        let op = "node_local_rank";
        let handle = self.comm(op, comm)?;
        let mut node = self.pre.comm_null;
        // SAFETY: a valid communicator, the family's predefined info and split type, and an
        // out-pointer to one handle.
        self.check(op, unsafe {
            (self.fns.MPI_Comm_split_type)(
                handle,
                A::COMM_TYPE_SHARED,
                0,
                self.pre.info_null,
                &mut node,
            )
        })?;
        let rank_and_size = self
            .comm_rank_raw(node)
            .and_then(|rank| Ok((rank, self.comm_size_raw(node)?)));
        // SAFETY: `node` is the communicator just created and nobody else holds it.
        self.check(op, unsafe { (self.fns.MPI_Comm_free)(&mut node) })?;
        rank_and_size
    }

    fn barrier(&self, comm: Comm) -> Result<()> {
        let comm = self.comm("barrier", comm)?;
        // SAFETY: a valid communicator.
        self.check("barrier", unsafe { (self.fns.MPI_Barrier)(comm) })
    }

    fn allreduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        // SAFETY (all reductions): pointers come from `Buf`/`BufMut`, valid for their counts,
        // offset by `in_segments` within those counts.
        self.reduction(
            "allreduce",
            comm,
            send,
            &recv,
            op,
            |s, r, n, t, o, c| unsafe { (self.fns.MPI_Allreduce)(s, r, n, t, o, c) },
        )
    }

    fn reduce(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp, root: i32) -> Result<()> {
        let name = "reduce";
        let handle = self.comm(name, comm)?;
        self.check_root(name, root, self.size_of(name, handle)?)?;
        if self.comm_rank_raw(handle)? == root {
            // A copy of the input stands in for MPI_IN_PLACE where the library crashes on it.
            let copy: Vec<u8>;
            let send = match send {
                Input::InPlace if root != 0 && self.quirks.reduce_in_place_off_rank_0_crashes => {
                    // SAFETY: `recv` is valid for reads of its length.
                    let input = unsafe { std::slice::from_raw_parts(recv.ptr(), recv.len_bytes()) };
                    copy = input.to_vec();
                    Input::Data(Buf::from_bytes(&copy, recv.dtype())?)
                }
                other => other,
            };
            return self.reduction(name, comm, send, &recv, op, |s, r, n, t, o, c| unsafe {
                (self.fns.MPI_Reduce)(s, r, n, t, o, root, c)
            });
        }
        // Away from the root only the input matters; "in place" there means the input is
        // in the receive buffer.
        let (ptr, count, dtype): (*const c_void, _, _) = match send {
            Input::Data(buf) => (buf.ptr().cast(), buf.count(), buf.dtype()),
            Input::InPlace => (recv.ptr().cast_const().cast(), recv.count(), recv.dtype()),
        };
        self.reduce_raw(
            name,
            handle,
            ptr,
            std::ptr::null_mut(),
            count,
            dtype,
            op,
            |s, r, n, t, o, c| unsafe { (self.fns.MPI_Reduce)(s, r, n, t, o, root, c) },
        )
    }

    fn scan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.reduction("scan", comm, send, &recv, op, |s, r, n, t, o, c| unsafe {
            (self.fns.MPI_Scan)(s, r, n, t, o, c)
        })
    }

    fn exscan(&self, comm: Comm, send: Input, recv: BufMut, op: ReduceOp) -> Result<()> {
        self.reduction("exscan", comm, send, &recv, op, |s, r, n, t, o, c| unsafe {
            (self.fns.MPI_Exscan)(s, r, n, t, o, c)
        })
    }

    fn reduce_scatter(&self, comm: Comm, send: Buf, recv: BufMut, op: ReduceOp) -> Result<()> {
        let name = "reduce_scatter";
        let handle = self.comm(name, comm)?;
        same_dtype(name, &send, &recv)?;
        let size = self.size_of(name, handle)?;
        let block = recv.count();
        expect_len(name, "the send buffer", send.count(), size * block)?;
        if block <= INT_MAX {
            let datatype = self.pre.datatype(recv.dtype());
            let op = self.op(name, op, recv.dtype())?;
            // SAFETY: send holds size*block elements, recv holds block.
            let rc = unsafe {
                (self.fns.MPI_Reduce_scatter_block)(
                    send.ptr().cast(),
                    recv.ptr().cast(),
                    block as c_int,
                    datatype,
                    op,
                    handle,
                )
            };
            return self.check(name, rc);
        }
        // Blocks too large for one call: reduce each block to its owner, in segments.
        let rank = self.comm_rank_raw(handle)? as usize;
        for owner in 0..size {
            let block_ptr = send
                .ptr()
                .wrapping_add(owner * block * send.dtype().size())
                .cast();
            let out = if owner == rank {
                recv.ptr().cast()
            } else {
                std::ptr::null_mut()
            };
            let root = owner as c_int;
            self.reduce_raw(
                name,
                handle,
                block_ptr,
                out,
                block,
                recv.dtype(),
                op,
                |s, r, n, t, o, c| unsafe { (self.fns.MPI_Reduce)(s, r, n, t, o, root, c) },
            )?;
        }
        Ok(())
    }

    fn bcast(&self, comm: Comm, buf: BufMut, root: i32) -> Result<()> {
        let name = "bcast";
        let handle = self.comm(name, comm)?;
        self.check_root(name, root, self.size_of(name, handle)?)?;
        let mode = self.mode([buf.count()]);
        let t = self.typed(name, &mode, buf.count(), buf.dtype())?;
        let p = buf.ptr().cast();
        // SAFETY (all data-moving ops): pointers and counts come from `Buf`/`BufMut`, and
        // `typed` describes exactly their elements.
        let rc = match mode {
            Mode::Int => unsafe { (self.fns.MPI_Bcast)(p, t.int(), t.datatype, root, handle) },
            Mode::Large(l) => unsafe { (l.MPI_Bcast_c)(p, t.count, t.datatype, root, handle) },
        };
        self.check(name, rc)
    }

    fn gather(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        let name = "gather";
        let handle = self.comm(name, comm)?;
        let size = self.size_of(name, handle)?;
        self.check_root(name, root, size)?;
        if self.comm_rank_raw(handle)? == root {
            same_dtype(name, &send, &recv)?;
            expect_len(
                name,
                "the receive buffer",
                recv.count(),
                size * send.count(),
            )?;
        }
        let mode = self.mode([send.count()]);
        let t = self.typed(name, &mode, send.count(), send.dtype())?;
        let (s, r) = (send.ptr().cast(), recv.ptr().cast());
        let rc = match mode {
            Mode::Int => unsafe {
                (self.fns.MPI_Gather)(s, t.int(), t.datatype, r, t.int(), t.datatype, root, handle)
            },
            Mode::Large(l) => unsafe {
                (l.MPI_Gather_c)(s, t.count, t.datatype, r, t.count, t.datatype, root, handle)
            },
        };
        self.check(name, rc)
    }

    fn allgather(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        let name = "allgather";
        let handle = self.comm(name, comm)?;
        same_dtype(name, &send, &recv)?;
        expect_len(
            name,
            "the receive buffer",
            recv.count(),
            self.size_of(name, handle)? * send.count(),
        )?;
        let mode = self.mode([send.count()]);
        let t = self.typed(name, &mode, send.count(), send.dtype())?;
        let (s, r) = (send.ptr().cast(), recv.ptr().cast());
        let rc = match mode {
            Mode::Int => unsafe {
                (self.fns.MPI_Allgather)(s, t.int(), t.datatype, r, t.int(), t.datatype, handle)
            },
            Mode::Large(l) => unsafe {
                (l.MPI_Allgather_c)(s, t.count, t.datatype, r, t.count, t.datatype, handle)
            },
        };
        self.check(name, rc)
    }

    fn scatter(&self, comm: Comm, send: Buf, recv: BufMut, root: i32) -> Result<()> {
        let name = "scatter";
        let handle = self.comm(name, comm)?;
        let size = self.size_of(name, handle)?;
        self.check_root(name, root, size)?;
        if self.comm_rank_raw(handle)? == root {
            same_dtype(name, &send, &recv)?;
            expect_len(name, "the send buffer", send.count(), size * recv.count())?;
        }
        let mode = self.mode([recv.count()]);
        let t = self.typed(name, &mode, recv.count(), recv.dtype())?;
        let (s, r) = (send.ptr().cast(), recv.ptr().cast());
        let rc = match mode {
            Mode::Int => unsafe {
                (self.fns.MPI_Scatter)(s, t.int(), t.datatype, r, t.int(), t.datatype, root, handle)
            },
            Mode::Large(l) => unsafe {
                (l.MPI_Scatter_c)(s, t.count, t.datatype, r, t.count, t.datatype, root, handle)
            },
        };
        self.check(name, rc)
    }

    fn alltoall(&self, comm: Comm, send: Buf, recv: BufMut) -> Result<()> {
        let name = "alltoall";
        let handle = self.comm(name, comm)?;
        same_dtype(name, &send, &recv)?;
        let size = self.size_of(name, handle)?;
        expect_len(name, "the receive buffer", recv.count(), send.count())?;
        if send.count() % size != 0 {
            return Err(Error::invalid_argument(
                name,
                format!(
                    "{} elements do not split into {size} equal blocks",
                    send.count()
                ),
            ));
        }
        let block = send.count() / size;
        let mode = self.mode([block]);
        let t = self.typed(name, &mode, block, send.dtype())?;
        let (s, r) = (send.ptr().cast(), recv.ptr().cast());
        let rc = match mode {
            Mode::Int => unsafe {
                (self.fns.MPI_Alltoall)(s, t.int(), t.datatype, r, t.int(), t.datatype, handle)
            },
            Mode::Large(l) => unsafe {
                (l.MPI_Alltoall_c)(s, t.count, t.datatype, r, t.count, t.datatype, handle)
            },
        };
        self.check(name, rc)
    }

    fn gatherv(
        &self,
        comm: Comm,
        send: Buf,
        recv: BufMut,
        counts: &[usize],
        displs: &[usize],
        root: i32,
    ) -> Result<()> {
        let name = "gatherv";
        let handle = self.comm(name, comm)?;
        let size = self.size_of(name, handle)?;
        self.check_root(name, root, size)?;
        let at_root = self.comm_rank_raw(handle)? == root;
        let mode = self.mode(counts.iter().chain(displs).copied().chain([send.count()]));
        let layout = if at_root {
            same_dtype(name, &send, &recv)?;
            expect_len(
                name,
                "the root's own block",
                send.count(),
                counts.get(root as usize).copied().unwrap_or(0),
            )?;
            self.layout(name, &mode, counts, displs, size, recv.count())?
        } else {
            self.layout(name, &mode, &[], &[], 0, 0)?
        };
        let t = self.typed(name, &mode, send.count(), send.dtype())?;
        let (s, r, dt) = (send.ptr().cast(), recv.ptr().cast(), t.datatype);
        let rc = match (&mode, &layout) {
            (Mode::Large(l), Layout::Large(c, d)) => unsafe {
                (l.MPI_Gatherv_c)(s, t.count, dt, r, c.as_ptr(), d.as_ptr(), dt, root, handle)
            },
            (_, Layout::Int(c, d)) => unsafe {
                (self.fns.MPI_Gatherv)(s, t.int(), dt, r, c.as_ptr(), d.as_ptr(), dt, root, handle)
            },
            _ => unreachable_layout(name)?,
        };
        self.check(name, rc)
    }

    fn allgatherv(
        &self,
        comm: Comm,
        send: Buf,
        recv: BufMut,
        counts: &[usize],
        displs: &[usize],
    ) -> Result<()> {
        let name = "allgatherv";
        let handle = self.comm(name, comm)?;
        same_dtype(name, &send, &recv)?;
        let size = self.size_of(name, handle)?;
        let rank = self.comm_rank_raw(handle)? as usize;
        let mode = self.mode(counts.iter().chain(displs).copied());
        let layout = self.layout(name, &mode, counts, displs, size, recv.count())?;
        expect_len(name, "this rank's block", send.count(), counts[rank])?;
        let t = self.typed(name, &mode, send.count(), send.dtype())?;
        let (s, r, dt) = (send.ptr().cast(), recv.ptr().cast(), t.datatype);
        let rc = match (&mode, &layout) {
            (Mode::Large(l), Layout::Large(c, d)) => unsafe {
                (l.MPI_Allgatherv_c)(s, t.count, dt, r, c.as_ptr(), d.as_ptr(), dt, handle)
            },
            (_, Layout::Int(c, d)) => unsafe {
                (self.fns.MPI_Allgatherv)(s, t.int(), dt, r, c.as_ptr(), d.as_ptr(), dt, handle)
            },
            _ => unreachable_layout(name)?,
        };
        self.check(name, rc)
    }

    fn scatterv(
        &self,
        comm: Comm,
        send: Buf,
        counts: &[usize],
        displs: &[usize],
        recv: BufMut,
        root: i32,
    ) -> Result<()> {
        let name = "scatterv";
        let handle = self.comm(name, comm)?;
        let size = self.size_of(name, handle)?;
        self.check_root(name, root, size)?;
        let at_root = self.comm_rank_raw(handle)? == root;
        let mode = self.mode(counts.iter().chain(displs).copied().chain([recv.count()]));
        let layout = if at_root {
            same_dtype(name, &send, &recv)?;
            expect_len(
                name,
                "the root's own block",
                recv.count(),
                counts.get(root as usize).copied().unwrap_or(0),
            )?;
            self.layout(name, &mode, counts, displs, size, send.count())?
        } else {
            self.layout(name, &mode, &[], &[], 0, 0)?
        };
        let t = self.typed(name, &mode, recv.count(), recv.dtype())?;
        let (s, r, dt) = (send.ptr().cast(), recv.ptr().cast(), t.datatype);
        let rc = match (&mode, &layout) {
            (Mode::Large(l), Layout::Large(c, d)) => unsafe {
                (l.MPI_Scatterv_c)(s, c.as_ptr(), d.as_ptr(), dt, r, t.count, dt, root, handle)
            },
            (_, Layout::Int(c, d)) => unsafe {
                (self.fns.MPI_Scatterv)(s, c.as_ptr(), d.as_ptr(), dt, r, t.int(), dt, root, handle)
            },
            _ => unreachable_layout(name)?,
        };
        self.check(name, rc)
    }

    fn alltoallv(
        &self,
        comm: Comm,
        send: Buf,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: BufMut,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let name = "alltoallv";
        let handle = self.comm(name, comm)?;
        same_dtype(name, &send, &recv)?;
        let size = self.size_of(name, handle)?;
        let mode = self.mode(
            [send_counts, send_displs, recv_counts, recv_displs]
                .into_iter()
                .flatten()
                .copied(),
        );
        let sent = self.layout(name, &mode, send_counts, send_displs, size, send.count())?;
        let received = self.layout(name, &mode, recv_counts, recv_displs, size, recv.count())?;
        let dt = self.pre.datatype(send.dtype());
        let (s, r) = (send.ptr().cast(), recv.ptr().cast());
        let rc = match (&mode, &sent, &received) {
            (Mode::Large(l), Layout::Large(sc, sd), Layout::Large(rc, rd)) => unsafe {
                (l.MPI_Alltoallv_c)(
                    s,
                    sc.as_ptr(),
                    sd.as_ptr(),
                    dt,
                    r,
                    rc.as_ptr(),
                    rd.as_ptr(),
                    dt,
                    handle,
                )
            },
            (_, Layout::Int(sc, sd), Layout::Int(rc, rd)) => unsafe {
                (self.fns.MPI_Alltoallv)(
                    s,
                    sc.as_ptr(),
                    sd.as_ptr(),
                    dt,
                    r,
                    rc.as_ptr(),
                    rd.as_ptr(),
                    dt,
                    handle,
                )
            },
            _ => unreachable_layout(name)?,
        };
        self.check(name, rc)
    }

    fn send(&self, comm: Comm, buf: Buf, dest: Peer, tag: i32) -> Result<()> {
        let name = "send";
        let handle = self.comm(name, comm)?;
        let dest = self.peer(name, dest, false)?;
        let mode = self.mode([buf.count()]);
        let t = self.typed(name, &mode, buf.count(), buf.dtype())?;
        let p = buf.ptr().cast();
        let rc = match mode {
            Mode::Int => unsafe { (self.fns.MPI_Send)(p, t.int(), t.datatype, dest, tag, handle) },
            Mode::Large(l) => unsafe { (l.MPI_Send_c)(p, t.count, t.datatype, dest, tag, handle) },
        };
        self.check(name, rc)
    }

    fn recv(&self, comm: Comm, buf: BufMut, source: Peer, tag: Option<i32>) -> Result<Status> {
        let name = "recv";
        let handle = self.comm(name, comm)?;
        let source = self.peer(name, source, true)?;
        let mode = self.mode([buf.count()]);
        let t = self.typed(name, &mode, buf.count(), buf.dtype())?;
        let (p, tag) = (buf.ptr().cast(), self.tag(tag));
        let mut status = RawStatus::default();
        let st = status.as_mut_ptr();
        let rc = match mode {
            Mode::Int => unsafe {
                (self.fns.MPI_Recv)(p, t.int(), t.datatype, source, tag, handle, st)
            },
            Mode::Large(l) => unsafe {
                (l.MPI_Recv_c)(p, t.count, t.datatype, source, tag, handle, st)
            },
        };
        self.check(name, rc)?;
        self.status(name, &mut status, &buf)
    }

    fn sendrecv(
        &self,
        comm: Comm,
        send: Buf,
        dest: Peer,
        send_tag: i32,
        recv: BufMut,
        source: Peer,
        recv_tag: Option<i32>,
    ) -> Result<Status> {
        let name = "sendrecv";
        let handle = self.comm(name, comm)?;
        let (dest, source) = (
            self.peer(name, dest, false)?,
            self.peer(name, source, true)?,
        );
        let mode = self.mode([send.count(), recv.count()]);
        let ts = self.typed(name, &mode, send.count(), send.dtype())?;
        let tr = self.typed(name, &mode, recv.count(), recv.dtype())?;
        let (s, r, rtag) = (send.ptr().cast(), recv.ptr().cast(), self.tag(recv_tag));
        let mut status = RawStatus::default();
        let st = status.as_mut_ptr();
        let rc = match mode {
            Mode::Int => unsafe {
                (self.fns.MPI_Sendrecv)(
                    s,
                    ts.int(),
                    ts.datatype,
                    dest,
                    send_tag,
                    r,
                    tr.int(),
                    tr.datatype,
                    source,
                    rtag,
                    handle,
                    st,
                )
            },
            Mode::Large(l) => unsafe {
                (l.MPI_Sendrecv_c)(
                    s,
                    ts.count,
                    ts.datatype,
                    dest,
                    send_tag,
                    r,
                    tr.count,
                    tr.datatype,
                    source,
                    rtag,
                    handle,
                    st,
                )
            },
        };
        self.check(name, rc)?;
        self.status(name, &mut status, &recv)
    }

    fn sendrecv_replace(
        &self,
        comm: Comm,
        buf: BufMut,
        dest: Peer,
        send_tag: i32,
        source: Peer,
        recv_tag: Option<i32>,
    ) -> Result<Status> {
        let name = "sendrecv";
        let handle = self.comm(name, comm)?;
        let (dest, source) = (
            self.peer(name, dest, false)?,
            self.peer(name, source, true)?,
        );
        let mode = self.mode([buf.count()]);
        let t = self.typed(name, &mode, buf.count(), buf.dtype())?;
        let (p, rtag) = (buf.ptr().cast(), self.tag(recv_tag));
        let mut status = RawStatus::default();
        let st = status.as_mut_ptr();
        // SAFETY: `buf` holds `t` elements, read and then written by this one call; `st`
        // is a whole MPI_Status of this family.
        let rc = match mode {
            Mode::Int => unsafe {
                (self.fns.MPI_Sendrecv_replace)(
                    p,
                    t.int(),
                    t.datatype,
                    dest,
                    send_tag,
                    source,
                    rtag,
                    handle,
                    st,
                )
            },
            Mode::Large(l) => unsafe {
                (l.MPI_Sendrecv_replace_c)(
                    p, t.count, t.datatype, dest, send_tag, source, rtag, handle, st,
                )
            },
        };
        self.check(name, rc)?;
        self.status(name, &mut status, &buf)
    }
}

/// `layout` builds `Layout::Large` exactly when the mode is `Large`; any other pairing is a
/// bug in this file, reported rather than acted on.
fn unreachable_layout(op: &'static str) -> Result<c_int> {
    Err(Error::new(
        jaxmpi_core::ErrorKind::Unsupported,
        op,
        "internal error: count mode and layout disagree",
    ))
}
