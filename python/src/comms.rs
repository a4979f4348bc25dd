//! Communicators from Python, outside any op: what jaxmpi's start-up and its `Comm`
//! objects ask of MPI (rank, size, dup, split, free), and the few collectives the start-up
//! makes on bytes (agreeing on settings, sharing the coordinator's address). Each runs
//! without the GIL: a collective waits for the other ranks.

use jaxmpi_core::{Broadcast, Buf, BufMut, Comm, Dtype, Input, ReduceOp};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{installed, on_library};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(world, m)?)?;
    m.add_function(wrap_pyfunction!(comm_info, m)?)?;
    m.add_function(wrap_pyfunction!(comm_rank, m)?)?;
    m.add_function(wrap_pyfunction!(comm_size, m)?)?;
    m.add_function(wrap_pyfunction!(comm_dup, m)?)?;
    m.add_function(wrap_pyfunction!(comm_split, m)?)?;
    m.add_function(wrap_pyfunction!(comm_free, m)?)?;
    m.add_function(wrap_pyfunction!(node_local_rank, m)?)?;
    m.add_function(wrap_pyfunction!(allgather_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(bcast_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(allreduce_max, m)?)?;
    m.add_function(wrap_pyfunction!(barrier, m)?)?;
    Ok(())
}

#[pyfunction]
fn world() -> PyResult<usize> {
    Ok(installed()?.world().0)
}

/// A communicator as an op needs it at trace time, in one crossing: checked to be a live
/// intracommunicator of the loaded library, then (rank, size).
#[pyfunction]
fn comm_info(py: Python<'_>, handle: usize) -> PyResult<(i32, i32)> {
    on_library(py, "comm_info", |l| {
        let comm = Comm(handle);
        l.check_comm(comm)?;
        Ok((l.comm_rank(comm)?, l.comm_size(comm)?))
    })
}

#[pyfunction]
fn comm_rank(py: Python<'_>, handle: usize) -> PyResult<i32> {
    on_library(py, "comm_rank", |l| l.comm_rank(Comm(handle)))
}

#[pyfunction]
fn comm_size(py: Python<'_>, handle: usize) -> PyResult<i32> {
    on_library(py, "comm_size", |l| l.comm_size(Comm(handle)))
}

#[pyfunction]
fn comm_dup(py: Python<'_>, handle: usize) -> PyResult<usize> {
    on_library(py, "comm_dup", |l| l.comm_dup(Comm(handle))).map(|c| c.0)
}

#[pyfunction]
#[pyo3(signature = (handle, color, key=0))]
fn comm_split(
    py: Python<'_>,
    handle: usize,
    color: Option<i32>,
    key: i32,
) -> PyResult<Option<usize>> {
    on_library(py, "comm_split", |l| l.comm_split(Comm(handle), color, key)).map(|c| c.map(|c| c.0))
}

#[pyfunction]
fn comm_free(py: Python<'_>, handle: usize) -> PyResult<()> {
    on_library(py, "comm_free", |l| l.comm_free(Comm(handle)))
}

/// This rank's (rank, size) among the ranks of the communicator on its node. Collective.
#[pyfunction]
fn node_local_rank(py: Python<'_>, handle: usize) -> PyResult<(i32, i32)> {
    on_library(py, "node_local_rank", |l| l.node_local_rank(Comm(handle)))
}

/// Every rank's `data`, in rank order: one MPI_Allgather of `data.len()` bytes per rank,
/// which must be the same on every rank (jaxmpi's start-up agreement on settings).
/// Collective over the communicator.
#[pyfunction]
fn allgather_bytes<'py>(
    py: Python<'py>,
    handle: usize,
    data: &[u8],
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let (size, gathered) = on_library(py, "allgather_bytes", |l| {
        let comm = Comm(handle);
        let size = l.comm_size(comm)? as usize;
        let mut gathered = vec![0u8; data.len() * size];
        let send = Buf::from_bytes(data, Dtype::U8)?;
        l.backend()
            .allgather(comm, send, BufMut::from_bytes(&mut gathered, Dtype::U8)?)?;
        Ok((size, gathered))
    })?;
    let n = data.len();
    Ok((0..size)
        .map(|rank| PyBytes::new(py, &gathered[rank * n..(rank + 1) * n]))
        .collect())
}

#[pyfunction]
fn barrier(py: Python<'_>, handle: usize) -> PyResult<()> {
    on_library(py, "barrier", |l| l.backend().barrier(Comm(handle)))
}

/// `root`'s `data` on every rank: one MPI_Bcast of `data.len()` bytes, which must be the
/// same on every rank (the other ranks' contents are not read). Collective.
#[pyfunction]
fn bcast_bytes<'py>(
    py: Python<'py>,
    handle: usize,
    data: &[u8],
    root: i32,
) -> PyResult<Bound<'py, PyBytes>> {
    let got = on_library(py, "bcast_bytes", |l| {
        let comm = Comm(handle);
        let mut got = data.to_vec();
        let buf = if l.comm_rank(comm)? == root {
            Broadcast::Root(Buf::from_bytes(data, Dtype::U8)?)
        } else {
            Broadcast::Receiver(BufMut::from_bytes(&mut got, Dtype::U8)?)
        };
        l.backend().bcast(comm, buf, root)?;
        Ok(got)
    })?;
    Ok(PyBytes::new(py, &got))
}

/// The largest of every rank's `values[i]`, for each i: one MPI_Allreduce(MAX) of as many
/// int64 as `values` holds, which must be the same on every rank. What a rank moves does
/// not grow with the ranks, where an allgather's does. Collective.
#[pyfunction]
fn allreduce_max(py: Python<'_>, handle: usize, values: Vec<i64>) -> PyResult<Vec<i64>> {
    on_library(py, "allreduce_max", |l| {
        let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let recv = BufMut::from_bytes(&mut bytes, Dtype::I64)?;
        l.backend()
            .allreduce(Comm(handle), Input::InPlace, recv, ReduceOp::Max)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|word| i64::from_ne_bytes(word.try_into().expect("8 bytes")))
            .collect())
    })
}
