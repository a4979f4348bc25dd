//! Records which `mpicc` a `linked` build used, so that errors can name the build-time MPI.
//! mpi-sys (through build-probe-mpi) takes `$MPICC`, else `mpicc` on PATH.

fn main() {
    println!("cargo:rerun-if-env-changed=MPICC");
    println!("cargo:rerun-if-env-changed=MPI_PKG_CONFIG");
    if std::env::var_os("CARGO_FEATURE_LINKED").is_some() {
        let mpicc = match (std::env::var("MPI_PKG_CONFIG"), std::env::var("MPICC")) {
            (Ok(pkg), _) => format!("pkg-config {pkg}"),
            (_, Ok(mpicc)) => mpicc,
            _ => "mpicc".to_string(),
        };
        println!("cargo:rustc-env=JAXMPI_LINKED_MPICC={mpicc}");
    }
}
