//! The GPU side from Python: what the CUDA driver and a buffer's allocation say, this
//! rank's GPU, and what the GPU decorators did (direct or staged).

use jaxmpi_backends::gpu::cuda;
use jaxmpi_backends::gpu::cuda_info::{decide_for_buffer, driver_files, driver_version, gpu_count};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{installed, to_py};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cuda_info, m)?)?;
    m.add_function(wrap_pyfunction!(use_gpu, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_counters, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(set_rank_gpu, m)?)?;
    Ok(())
}

/// What the CUDA side found: whether the driver loads, which file it is (and every libcuda
/// mapped in the process: one, unless a second was loaded), its CUDA version and how many
/// GPUs it sees. Loads libcuda: call it only where CUDA is wanted.
#[pyfunction]
fn cuda_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    let driver = cuda::load_driver();
    dict.set_item("driver", driver.is_ok())?;
    dict.set_item("driver_error", driver.err().map(|e| e.to_string()))?;
    dict.set_item("devices", gpu_count().unwrap_or(0))?;
    dict.set_item("driver_version", driver_version().ok())?;
    let files = driver_files().ok();
    dict.set_item("libcuda", files.as_ref().map(|f| f.0.clone()))?;
    dict.set_item("libcuda_was_loaded", files.as_ref().map(|f| f.1))?;
    dict.set_item("libcudas_mapped", files.map(|f| f.2).unwrap_or_default())?;
    Ok(dict)
}

/// Makes GPU `ordinal` this thread's current GPU, before MPI initializes.
#[pyfunction]
fn use_gpu(ordinal: i32) -> PyResult<()> {
    cuda::use_gpu(ordinal).map_err(to_py)
}

/// What the GPU decorators did so far: ops direct, staged (and why), chunks, pinned
/// allocations and bytes held.
#[pyfunction]
fn gpu_counters(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    for (name, value) in cuda::counters() {
        dict.set_item(name, value)?;
    }
    Ok(dict)
}

/// What the driver says of the allocation holding the GPU address `address`, and
/// what this process does with such a buffer: {attribute: value or error text,
/// "mode": "direct" or "staged", "why": ...}.
#[pyfunction]
fn cuda_buffer(py: Python<'_>, address: usize) -> PyResult<Bound<'_, PyDict>> {
    let dict = PyDict::new(py);
    for (name, value) in cuda::pointer_attributes(address).map_err(to_py)? {
        match value {
            Ok(value) => dict.set_item(name, value)?,
            Err(err) => dict.set_item(name, err.to_string())?,
        }
    }
    let (mode, why) = match decide_for_buffer(installed()?, address) {
        Ok((true, why)) => ("direct", why),
        Ok((false, why)) => ("staged", why),
        Err(err) => ("unknown", err.to_string()),
    };
    dict.set_item("mode", mode)?;
    dict.set_item("why", why)?;
    Ok(dict)
}

/// The GPU this rank's arrays must be on (None: no check).
#[pyfunction]
#[pyo3(signature = (ordinal=None))]
fn set_rank_gpu(ordinal: Option<i32>) {
    cuda::set_rank_gpu(ordinal);
}
