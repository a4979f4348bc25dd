//! `MpiLibrary<A>`: one MPI library, loaded with dlopen, driven through the function table,
//! with the family's differences supplied by `A: Abi`. This file holds loading,
//! initialization and the helpers the ops share; the ops themselves are in `ops.rs`.

use std::ffi::{c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use jaxmpi_core::{
    Buf, BufMut, Comm, Dtype, Error, Input, LibraryInfo, Peer, ReduceOp, Result, ThreadLevel,
};
use libloading::Library;

use super::abi::{Abi, Predefined, RawStatus};
use super::cuda_aware::{self, CudaAware, LibraryAnswer};
use super::functions::{self, Aint, Functions, LargeCountFunctions};
use super::own_ops;
use super::quirks::Quirks;

/// Largest count a classic (non-`_c`) MPI call takes.
pub const INT_MAX: usize = c_int::MAX as usize;
/// Elements per segment when a reduction is split to fit `int` counts.
pub const SEGMENT: usize = 1 << 30;
const MPI_UNDEFINED: c_int = -32766;
/// Large enough for every family's MPI_MAX_LIBRARY_VERSION_STRING and MPI_MAX_ERROR_STRING.
const STRING_BUFFER: usize = 8192;

pub struct MpiLibrary<A: Abi> {
    pub(super) lib: Library,
    pub(super) fns: Functions<A::Handle>,
    pub(super) large: Option<LargeCountFunctions<A::Handle>>,
    pub(super) pre: Predefined<A::Handle>,
    /// jaxmpi's own reductions (see `own_ops`), created once at load.
    own_ops: Vec<(Dtype, ReduceOp, A::Handle)>,
    /// Bugs of this library version that the ops work around.
    pub(super) quirks: Quirks,
    pub(super) info: LibraryInfo,
    pub(super) thread_level: ThreadLevel,
    pub(super) initialized_here: bool,
    pub(super) finalized_here: AtomicBool,
    pub(super) world_rank: i32,
    pub(super) cuda_aware: CudaAware,
}

/// How counts are passed to MPI for one call.
pub(super) enum Mode<'a, H> {
    /// Classic `int` counts; pieces above INT_MAX travel as one element of a derived type.
    Int,
    /// MPI-4 `_c` functions with 64-bit counts.
    Large(&'a LargeCountFunctions<H>),
}

/// A buffer as (count, datatype) for one MPI call; frees its derived type when dropped.
pub(super) struct Typed<'a, A: Abi> {
    pub count: i64,
    pub datatype: A::Handle,
    derived: bool,
    lib: &'a MpiLibrary<A>,
}

impl<A: Abi> Typed<'_, A> {
    /// The count as `int`, for `Mode::Int` calls (where it is always at most INT_MAX).
    pub fn int(&self) -> c_int {
        self.count as c_int
    }
}

impl<A: Abi> Drop for Typed<'_, A> {
    fn drop(&mut self) {
        if self.derived {
            // SAFETY: a datatype this struct created and nobody else holds.
            unsafe { (self.lib.fns.MPI_Type_free)(&mut self.datatype) };
        }
    }
}

pub(crate) fn c_string(buffer: &[c_char], len: c_int) -> String {
    let len = usize::try_from(len).unwrap_or(0).min(buffer.len());
    let bytes: Vec<u8> = buffer[..len].iter().map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes)
        .trim_end_matches('\0')
        .trim()
        .to_string()
}

impl<A: Abi> MpiLibrary<A> {
    /// Takes over an opened library: resolves every function, checks the MPI version,
    /// initializes MPI unless someone already did, and prepares jaxmpi's own ops.
    pub fn load(lib: Library, path: PathBuf, chosen_by: String) -> Result<Self> {
        let fns = Functions::<A::Handle>::load(&lib).map_err(|missing| {
            Error::library(
                "load MPI",
                format!(
                    "{} is not a usable MPI library: it has no {missing}",
                    path.display()
                ),
            )
        })?;
        Self::with_functions(lib, fns, path, chosen_by)
    }

    /// As `load`, with the function table already filled (from dlsym or by the linker);
    /// `lib` serves the optional lookups.
    pub(crate) fn with_functions(
        lib: Library,
        fns: Functions<A::Handle>,
        path: PathBuf,
        chosen_by: String,
    ) -> Result<Self> {
        let step = "load MPI";
        let shown = path.display().to_string();
        let pre =
            A::predefined(&lib).map_err(|why| Error::library(step, format!("{shown}: {why}")))?;
        let large = LargeCountFunctions::load(&lib).ok();

        let (mut major, mut minor) = (0, 0);
        // SAFETY: MPI_Get_version may be called before MPI_Init; it writes two ints.
        unsafe { (fns.MPI_Get_version)(&mut major, &mut minor) };
        if major < 3 {
            return Err(Error::library(
                step,
                format!("{shown} implements MPI {major}.{minor}; jaxmpi needs MPI 3.0 or newer"),
            ));
        }
        let mut buffer = vec![0 as c_char; STRING_BUFFER];
        let mut len = 0;
        // SAFETY: callable before MPI_Init; the buffer is larger than any family's maximum.
        unsafe { (fns.MPI_Get_library_version)(buffer.as_mut_ptr(), &mut len) };
        let version_string = c_string(&buffer, len);

        let mut library = MpiLibrary {
            lib,
            fns,
            large,
            pre,
            own_ops: Vec::new(),
            quirks: Quirks::default(),
            info: LibraryInfo {
                family: A::FAMILY,
                path,
                version_string,
                standard_version: (major, minor),
                chosen_by,
                any_source: A::ANY_SOURCE,
                proc_null: A::PROC_NULL,
                any_tag: A::ANY_TAG,
                status_size: A::STATUS_SIZE,
            },
            thread_level: ThreadLevel::Single,
            initialized_here: false,
            finalized_here: AtomicBool::new(false),
            world_rank: -1,
            cuda_aware: CudaAware {
                aware: false,
                reason: "not decided before MPI_Init".into(),
            },
        };
        library.initialize()?;
        Ok(library)
    }

    fn initialize(&mut self) -> Result<()> {
        let step = "initialize MPI";
        let (mut initialized, mut finalized) = (0, 0);
        // SAFETY: both may be called at any time and write one int.
        unsafe {
            (self.fns.MPI_Finalized)(&mut finalized);
            (self.fns.MPI_Initialized)(&mut initialized);
        }
        if finalized != 0 {
            return Err(Error::library(
                step,
                "MPI was already finalized in this process; it cannot be used again",
            ));
        }
        let mut provided = 0;
        if initialized == 0 {
            let multiple = A::THREAD_LEVELS[3];
            // SAFETY: MPI is not initialized; NULL argc/argv is allowed.
            let rc = unsafe {
                (self.fns.MPI_Init_thread)(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    multiple,
                    &mut provided,
                )
            };
            if rc != 0 {
                return Err(Error::mpi(
                    step,
                    rc,
                    format!("MPI_Init_thread returned {rc}"),
                ));
            }
            self.initialized_here = true;
            // As mpi4py does: errors on the predefined communicators (and on handles
            // that are no communicator at all) come back as codes instead of aborting.
            for comm in [self.pre.comm_world, self.pre.comm_self] {
                // SAFETY: predefined communicators of an initialized MPI.
                let rc =
                    unsafe { (self.fns.MPI_Comm_set_errhandler)(comm, self.pre.errors_return) };
                self.check(step, rc)?;
            }
        } else {
            // SAFETY: MPI is initialized; writes one int.
            unsafe { (self.fns.MPI_Query_thread)(&mut provided) };
        }
        self.thread_level = match A::THREAD_LEVELS.iter().position(|&l| l == provided) {
            Some(0) => ThreadLevel::Single,
            Some(1) => ThreadLevel::Funneled,
            Some(2) => ThreadLevel::Serialized,
            Some(_) => ThreadLevel::Multiple,
            None => {
                return Err(Error::library(
                    step,
                    format!("MPI reported unknown thread level {provided}"),
                ))
            }
        };
        if self.thread_level < ThreadLevel::Serialized {
            return Err(Error::library(
                step,
                format!(
                    "MPI was initialized with {}, but XLA calls MPI from its own threads: \
                     initialize MPI with MPI_THREAD_MULTIPLE (mpi4py's default) or let jaxmpi do it",
                    self.thread_level.name()
                ),
            ));
        }
        self.world_rank = self.comm_rank_raw(self.pre.comm_world)?;
        self.check_datatype_table()?;
        self.quirks = Quirks::of(&self.info);
        for (dtype, op) in own_ops::needed(self.quirks.unsigned_min_max_as_signed) {
            let Some(callback) = own_ops::callback(dtype, op) else {
                continue;
            };
            let mut handle = self.pre.op_null;
            // SAFETY: a valid callback and an out-pointer to one handle.
            let rc = unsafe { (self.fns.MPI_Op_create)(callback, 1, &mut handle) };
            self.check(step, rc)?;
            self.own_ops.push((dtype, op, handle));
        }
        let setting = std::env::var(cuda_aware::SETTING).ok();
        let hints: Vec<(&str, String)> = A::CUDA_HINTS
            .iter()
            .filter_map(|&name| Some((name, std::env::var(name).ok()?)))
            .collect();
        let hints: Vec<(&str, &str)> = hints.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.cuda_aware =
            cuda_aware::decide(setting.as_deref(), self.query_cuda_support(), &hints)?;
        Ok(())
    }

    fn query_cuda_support(&self) -> LibraryAnswer {
        type GpuQuery = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
        type CudaQuery = unsafe extern "C" fn() -> c_int;
        const MPIX_GPU_SUPPORT_CUDA: c_int = 0;
        // SAFETY: the prototypes MPICH (>= 4) and Open MPI document for these extensions.
        unsafe {
            if let Some(query) =
                functions::optional::<GpuQuery>(&self.lib, "MPIX_GPU_query_support")
            {
                let mut supported = 0;
                let rc = query(MPIX_GPU_SUPPORT_CUDA, &mut supported);
                return LibraryAnswer::Answered {
                    query: "MPIX_GPU_query_support",
                    supported: rc == 0 && supported != 0,
                };
            }
            match functions::optional::<CudaQuery>(&self.lib, "MPIX_Query_cuda_support") {
                Some(query) => LibraryAnswer::Answered {
                    query: "MPIX_Query_cuda_support",
                    supported: query() != 0,
                },
                None => LibraryAnswer::NoQuery,
            }
        }
    }

    pub(super) fn finalize_if_owned(&self) -> Result<()> {
        if !self.initialized_here || self.finalized_here.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let mut finalized = 0;
        // SAFETY: may be called at any time.
        unsafe { (self.fns.MPI_Finalized)(&mut finalized) };
        if finalized != 0 {
            return Ok(());
        }
        for &(_, _, mut op) in &self.own_ops {
            // SAFETY: ops this library created and nothing uses any more.
            unsafe { (self.fns.MPI_Op_free)(&mut op) };
        }
        // SAFETY: MPI is initialized, not finalized, and was initialized by us.
        let rc = unsafe { (self.fns.MPI_Finalize)() };
        self.check("finalize MPI", rc)
    }

    /// Turns an MPI return code into an error carrying the class and the library's text.
    pub(super) fn check(&self, op: &'static str, rc: c_int) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let mut class = rc;
        let mut buffer = vec![0 as c_char; STRING_BUFFER];
        let mut len = 0;
        // SAFETY: both accept any error code; the buffer exceeds MPI_MAX_ERROR_STRING.
        unsafe {
            (self.fns.MPI_Error_class)(rc, &mut class);
            (self.fns.MPI_Error_string)(rc, buffer.as_mut_ptr(), &mut len);
        }
        Err(Error::mpi(
            op,
            class,
            format!("rank {}: {}", self.world_rank, c_string(&buffer, len)),
        ))
    }

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
    pub(super) fn comm(&self, op: &'static str, comm: Comm) -> Result<A::Handle> {
        let handle = A::handle_from_raw(comm.0).map_err(|why| {
            Error::invalid_argument(
                op,
                format!(
                    "communicator {why}. The loaded MPI is {} ({}): pass a communicator of that library",
                    A::FAMILY,
                    self.info.path.display()
                ),
            )
        })?;
        if handle == self.pre.comm_null {
            return Err(Error::invalid_argument(
                op,
                "the communicator is MPI_COMM_NULL",
            ));
        }
        Ok(handle)
    }

    pub(super) fn to_comm(&self, handle: A::Handle) -> Comm {
        Comm(A::handle_to_raw(handle))
    }

    /// The op handle for `op` on `dtype`, refusing pairs MPI does not define.
    pub(super) fn op(&self, name: &'static str, op: ReduceOp, dtype: Dtype) -> Result<A::Handle> {
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
        let own = self
            .own_ops
            .iter()
            .find(|&&(d, o, _)| d == dtype && o == op);
        match (own, self.pre.op(op)) {
            (Some(&(_, _, handle)), _) => Ok(handle),
            (None, Some(handle)) if !dtype.is_half() => Ok(handle),
            _ => Err(Error::unsupported(
                name,
                format!("{op} on {dtype} is not available"),
            )),
        }
    }

    /// MPI's integer for a peer rank.
    pub(super) fn peer(&self, op: &'static str, peer: Peer, is_source: bool) -> Result<c_int> {
        match peer {
            Peer::Rank(rank) => Ok(rank),
            Peer::Null => Ok(A::PROC_NULL),
            Peer::Any if is_source => Ok(A::ANY_SOURCE),
            Peer::Any => Err(Error::invalid_argument(
                op,
                "ANY_SOURCE is not a valid destination",
            )),
        }
    }

    pub(super) fn tag(&self, tag: Option<i32>) -> c_int {
        tag.unwrap_or(A::ANY_TAG)
    }

    /// Which count convention a call moving pieces of these sizes uses.
    pub(super) fn mode(&self, counts: impl IntoIterator<Item = usize>) -> Mode<'_, A::Handle> {
        match &self.large {
            Some(large) if counts.into_iter().any(|c| c > INT_MAX) => Mode::Large(large),
            _ => Mode::Int,
        }
    }

    /// `count` elements of `dtype` as MPI arguments under `mode`.
    pub(super) fn typed(
        &self,
        op: &'static str,
        mode: &Mode<A::Handle>,
        count: usize,
        dtype: Dtype,
    ) -> Result<Typed<'_, A>> {
        let basic = self.pre.datatype(dtype);
        if matches!(mode, Mode::Large(_)) || count <= INT_MAX {
            return Ok(Typed {
                count: count as i64,
                datatype: basic,
                derived: false,
                lib: self,
            });
        }
        let datatype = self.big_datatype(op, count, basic)?;
        Ok(Typed {
            count: 1,
            datatype,
            derived: true,
            lib: self,
        })
    }

    /// One derived datatype spanning `count` contiguous elements (count > INT_MAX), for
    /// libraries without large-count functions: `SEGMENT`-sized blocks plus a remainder.
    fn big_datatype(&self, op: &'static str, count: usize, basic: A::Handle) -> Result<A::Handle> {
        let size = self.element_size(basic)?;
        let (blocks, rest) = (count / SEGMENT, count % SEGMENT);
        let mut block = self.pre.op_null;
        let mut all_blocks = self.pre.op_null;
        // SAFETY: creating types from committed predefined/derived types; out-pointers valid.
        unsafe {
            self.check(
                op,
                (self.fns.MPI_Type_contiguous)(SEGMENT as c_int, basic, &mut block),
            )?;
            let rc = (self.fns.MPI_Type_contiguous)(blocks as c_int, block, &mut all_blocks);
            (self.fns.MPI_Type_free)(&mut block);
            self.check(op, rc)?;
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
                self.check(op, rc)?;
            }
        }
        // SAFETY: `whole` is a valid, uncommitted derived type.
        self.check(op, unsafe { (self.fns.MPI_Type_commit)(&mut whole) })?;
        Ok(whole)
    }

    /// Every predefined datatype must have its dtype's size: a wrong table entry would
    /// corrupt memory, so a library that disagrees is refused at load.
    fn check_datatype_table(&self) -> Result<()> {
        for dtype in Dtype::ALL {
            let datatype = self.pre.datatype(dtype);
            let size = self.element_size(datatype)?;
            if size != dtype.size() {
                return Err(Error::library(
                    "load MPI",
                    format!(
                        "{}: the {} datatype for {dtype} ({}) has {size} bytes, not {}",
                        self.info.path.display(),
                        A::FAMILY,
                        self.name_of(datatype),
                        dtype.size()
                    ),
                ));
            }
        }
        Ok(())
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
    pub(super) fn received(
        &self,
        op: &'static str,
        status: &mut RawStatus,
        dtype: Dtype,
    ) -> Result<usize> {
        let mut count = 0;
        // SAFETY: a status filled by the receive that just completed.
        let rc = unsafe {
            (self.fns.MPI_Get_elements_x)(status.as_mut_ptr(), self.pre.datatype(dtype), &mut count)
        };
        self.check(op, rc)?;
        if count == MPI_UNDEFINED as i64 {
            return Err(Error::mpi(
                op,
                0,
                "the received message is not a whole number of elements",
            ));
        }
        Ok(count as usize)
    }

    /// Splits an elementwise reduction of `count` elements into calls of at most `SEGMENT`
    /// elements (always at least one call, so every rank enters the collective). Exact for
    /// any op, user ops included, and needs no large-count functions.
    pub(super) fn in_segments(
        &self,
        op: &'static str,
        count: usize,
        dtype: Dtype,
        send: *const c_void,
        recv: *mut c_void,
        mut call: impl FnMut(*const c_void, *mut c_void, c_int) -> c_int,
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
            self.check(op, call(send_at, recv_at, n as c_int))?;
            start += n;
            if start >= count {
                return Ok(());
            }
        }
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
}

/// Checks that two buffers of one op agree on dtype.
pub(super) fn same_dtype(op: &'static str, send: &Buf, recv: &BufMut) -> Result<()> {
    if send.dtype() != recv.dtype() {
        return Err(Error::invalid_argument(
            op,
            format!(
                "send buffer is {} but receive buffer is {}",
                send.dtype(),
                recv.dtype()
            ),
        ));
    }
    Ok(())
}

/// `MPI_Get_library_version` text, whitespace-normalized, for one-line summaries.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
