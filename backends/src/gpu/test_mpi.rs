//! What the GPU unit tests share: a real MPI library at 1 rank (`JAXMPI_TEST_LIBS_MPICH`,
//! as ci/checks/cargo_test.sh sets it; without it, the tests that need MPI skip and say
//! so), and float32 buffers.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use jaxmpi_core::{Backend, Buf, BufMut, Comm, Dtype, Input, Library, ReduceOp};

use crate::select::detect::{Request, SearchPath};

/// The MPI library the tests run on, or None (with a line on stderr) when
/// `JAXMPI_TEST_LIBS_MPICH` is unset. A path that does not load fails the test.
pub fn mpi() -> Option<&'static dyn Library> {
    static MPI: OnceLock<Option<Box<dyn Library>>> = OnceLock::new();
    let library = MPI.get_or_init(|| {
        let path = std::env::var_os("JAXMPI_TEST_LIBS_MPICH")?;
        let search = SearchPath { prefixes: vec![] };
        let request = Request::Path(PathBuf::from(path));
        Some(crate::select::load(&request, &search).expect("load MPI"))
    });
    if library.is_none() {
        eprintln!("skipped: set JAXMPI_TEST_LIBS_MPICH to a libmpi.so.12 to run this test");
    }
    library.as_deref()
}

pub fn floats(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_ne_bytes).collect()
}

pub fn input(bytes: &[u8]) -> Buf<'_> {
    Buf::from_bytes(bytes, Dtype::F32).unwrap()
}

pub fn output(bytes: &mut [u8]) -> BufMut<'_> {
    BufMut::from_bytes(bytes, Dtype::F32).unwrap()
}

pub fn count(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// What a sum of `values` over `world` through `backend` fails with (it must fail).
pub fn failed_sum(
    backend: &dyn Backend,
    world: Comm,
    values: impl IntoIterator<Item = f32>,
) -> String {
    let send = floats(values);
    let mut recv = vec![0u8; send.len()];
    backend
        .allreduce(
            world,
            Input::Data(input(&send)),
            output(&mut recv),
            ReduceOp::Sum,
        )
        .unwrap_err()
        .to_string()
}
