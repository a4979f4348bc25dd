//! `Library` for `MpiLibrary`: identity, lifetime, error handlers and communicators.

use std::ffi::c_int;

use jaxmpi_core::{
    Backend, Comm, Dtype, Error, Library, LibraryInfo, ReduceOp, Result, ThreadLevel,
};

use super::abi::Abi;
use super::library::MpiLibrary;

impl<A: Abi> Library for MpiLibrary<A> {
    fn info(&self) -> &LibraryInfo {
        &self.info
    }
    fn thread_level(&self) -> ThreadLevel {
        self.thread_level
    }
    fn initialized_here(&self) -> bool {
        self.initialized_here
    }
    fn finalize(&self) -> Result<()> {
        self.finalize_if_owned()
    }
    fn finalized(&self) -> bool {
        let mut finalized = 0;
        // SAFETY: may be called at any time, also after MPI_Finalize; writes one int.
        unsafe { (self.fns.MPI_Finalized)(&mut finalized) };
        finalized != 0
    }
    fn cuda_aware(&self) -> bool {
        self.cuda_aware.aware
    }
    fn cuda_aware_reason(&self) -> &str {
        &self.cuda_aware.reason
    }
    fn cuda_aware_checks_buffers(&self) -> bool {
        self.cuda_aware.checks_buffers
    }
    fn reduces_on_host(&self, dtype: Dtype, op: ReduceOp) -> bool {
        matches!(op, ReduceOp::User(_))
            || self
                .own_reductions
                .iter()
                .any(|&(d, o, _)| d == dtype && o == op)
    }
    fn reduce_in_place_reads_host(&self, root: i32) -> bool {
        root != 0 && self.quirks.reduce_in_place_off_rank_0_crashes
    }
    fn abort(&self, code: i32) -> ! {
        // SAFETY: MPI is initialized; MPI_Abort may be called from any thread.
        unsafe { (self.fns.MPI_Abort)(self.pre.comm_world, code) };
        // MPI_Abort is not supposed to return; if it does, this process ends at least.
        std::process::exit(code)
    }

    fn return_errors_on(&self, comm: Comm) -> Result<Option<usize>> {
        // One step for the user: which of its MPI calls failed matters less than that the
        // check before the op did.
        let op = "error handler check";
        let handle = self.comm(comm).map_err(|err| err.in_op(op))?;
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
        let handle = self.comm(comm).map_err(|err| err.in_op(op))?;
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
        self.comm_rank_raw(self.comm(comm)?)
    }

    fn comm_size(&self, comm: Comm) -> Result<i32> {
        self.comm_size_raw(self.comm(comm)?)
    }

    fn comm_dup(&self, comm: Comm) -> Result<Comm> {
        let handle = self.comm(comm)?;
        let mut copy = self.pre.comm_null;
        // SAFETY: a valid communicator and an out-pointer to one handle.
        self.check("MPI_Comm_dup", unsafe {
            (self.fns.MPI_Comm_dup)(handle, &mut copy)
        })?;
        // SAFETY: `copy` is the communicator just created.
        self.check("MPI_Comm_set_errhandler", unsafe {
            (self.fns.MPI_Comm_set_errhandler)(copy, self.pre.errors_return)
        })?;
        Ok(self.to_comm(copy))
    }

    fn comm_split(&self, comm: Comm, color: Option<i32>, key: i32) -> Result<Option<Comm>> {
        let handle = self.comm(comm)?;
        if color.is_some_and(|c| c < 0) {
            return Err(Error::invalid_argument(
                "color",
                "color must be non-negative (or None for MPI_UNDEFINED)",
            ));
        }
        let mut part = self.pre.comm_null;
        // SAFETY: a valid communicator and an out-pointer to one handle.
        let rc =
            unsafe { (self.fns.MPI_Comm_split)(handle, color.unwrap_or(-32766), key, &mut part) };
        self.check("MPI_Comm_split", rc)?;
        if part == self.pre.comm_null {
            return Ok(None);
        }
        // SAFETY: `part` is the communicator just created.
        self.check("MPI_Comm_set_errhandler", unsafe {
            (self.fns.MPI_Comm_set_errhandler)(part, self.pre.errors_return)
        })?;
        Ok(Some(self.to_comm(part)))
    }

    fn comm_free(&self, comm: Comm) -> Result<()> {
        let mut handle = self.comm(comm)?;
        if handle == self.pre.comm_world || handle == self.pre.comm_self {
            return Err(Error::invalid_argument(
                "communicator",
                "predefined communicators cannot be freed",
            ));
        }
        // SAFETY: a user communicator; MPI sets the handle to COMM_NULL.
        self.check("MPI_Comm_free", unsafe {
            (self.fns.MPI_Comm_free)(&mut handle)
        })
    }

    fn comm_create_group(&self, ranks: &[i32], tag: i32) -> Result<Comm> {
        let count = c_int::try_from(ranks.len())
            .map_err(|_| Error::invalid_argument("ranks", "more ranks than a C int counts"))?;
        let (mut world, mut part) = (self.pre.comm_null, self.pre.comm_null);
        // SAFETY: the world communicator and an out-pointer to one group handle.
        self.check("MPI_Comm_group", unsafe {
            (self.fns.MPI_Comm_group)(self.pre.comm_world, &mut world)
        })?;
        // SAFETY: `world` is the group just made; `ranks` holds `count` ranks.
        let included = self.check("MPI_Group_incl", unsafe {
            (self.fns.MPI_Group_incl)(world, count, ranks.as_ptr(), &mut part)
        });
        // SAFETY: `world` is ours to free.
        unsafe { (self.fns.MPI_Group_free)(&mut world) };
        included?;
        let mut comm = self.pre.comm_null;
        // SAFETY: a group of world ranks, every one of which makes this same call.
        let created = self.check("MPI_Comm_create_group", unsafe {
            (self.fns.MPI_Comm_create_group)(self.pre.comm_world, part, tag, &mut comm)
        });
        // SAFETY: `part` is ours to free.
        unsafe { (self.fns.MPI_Group_free)(&mut part) };
        created?;
        // SAFETY: `comm` is the communicator just created.
        self.check("MPI_Comm_set_errhandler", unsafe {
            (self.fns.MPI_Comm_set_errhandler)(comm, self.pre.errors_return)
        })?;
        Ok(self.to_comm(comm))
    }

    fn node_local_rank(&self, comm: Comm) -> Result<(i32, i32)> {
        let handle = self.comm(comm)?;
        let mut node = self.pre.comm_null;
        // SAFETY: a valid communicator, the family's predefined info and split type, and an
        // out-pointer to one handle.
        self.check("MPI_Comm_split_type", unsafe {
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
        self.check("MPI_Comm_free", unsafe {
            (self.fns.MPI_Comm_free)(&mut node)
        })?;
        rank_and_size
    }

    fn backend(&self) -> &dyn Backend {
        self
    }
}
