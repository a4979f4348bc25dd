//! An op's signature as the table in `mod.rs` declares it (`Signature`: operands,
//! results, attributes, its started form, why it cannot run on GPU buffers), and
//! `declare_ops!`, which turns that table into everything that must agree with it: the
//! signatures Python reads (`_native.signatures()`), each op's typed attributes
//! (`attrs::*`, decoded as `xla/frame/attributes.rs` says) and its exported handlers, for
//! the CPU and for CUDA. The table, its rows' types and this macro are one declaration:
//! kept apart from the attributes' encoding, which knows no op.

use crate::xla::frame::Kind;

/// One attribute of an op: its name at every layer and its kind.
#[derive(Clone, Copy, Debug)]
pub struct AttrDecl {
    pub name: &'static str,
    pub kind: Kind,
}

/// One op as declared: operands, results (present on the ranks that receive) and
/// attributes, in the order the lowering passes them.
#[derive(Clone, Copy, Debug)]
pub struct Signature {
    pub name: &'static str,
    pub operands: &'static [&'static str],
    pub results: &'static [&'static str],
    pub attrs: &'static [AttrDecl],
    /// The name of the op's started form (`iallreduce`), "" where it has none. Its call
    /// takes the op's operands and attributes, and one more attribute,
    /// [`STARTED_RESULTS`]; its results are the request value, the op's results, and the
    /// operands the transfer reads, passed through to the wait (`Call::starting`).
    pub started: &'static str,
    /// Why the op cannot run on GPU buffers, "" where it can: its row's `host_only`
    /// reason. An op that can has a handler for CUDA (`GPU_HANDLERS`); a lowering for
    /// CUDA of one that cannot refuses with this reason. No started form runs there
    /// ([`NON_BLOCKING`]).
    pub host_only: &'static str,
}

// Why an op cannot run on GPU buffers (a row's `host_only`), as a lowering for CUDA says it.
/// Every started form, and the wait: non-blocking ops are not built for GPU buffers yet.
pub const NON_BLOCKING: &str = "non-blocking ops on GPU arrays are not supported yet: use the \
    blocking op, or move the array to the host first";
/// Counts computed inside jit: operands the handler reads on the CPU.
pub const RUN_TIME_COUNTS: &str = "counts computed inside jit are read by the CPU at run \
    time; on GPU arrays, use static counts (without recv_capacity=)";
/// XLA's collectives as the HLO pass rewrites them: JAX runs the pass on XLA:CPU's modules
/// only (on GPUs XLA runs its collectives over NCCL).
pub const HLO_PASS: &str = "XLA's collectives rewritten by jaxmpi's HLO pass, which runs \
    on XLA:CPU only";

impl Signature {
    /// Whether the op moves data between ranks of a communicator without naming a peer:
    /// a collective, which every rank calls (the wait, which completes a request, is none).
    pub fn is_collective(&self) -> bool {
        let has = |kind| self.attrs.iter().any(|a| a.kind == kind);
        has(Kind::Comm) && !has(Kind::Peer) && self.operands.first() != Some(&"request")
    }

    /// The op called `name`, or started by that name (true).
    pub fn named(name: &str) -> Option<(&'static Signature, bool)> {
        super::SIGNATURES
            .iter()
            .find_map(|s| (s.name == name || s.started == name).then_some((s, s.started == name)))
    }
}

/// The attribute of a started op's call that says how many of the op's results it has (a
/// rooted op's differ between ranks).
pub const STARTED_RESULTS: &str = "results";

/// Declares every op once: its signature (for Python), its typed attributes (for its
/// body) and its exported handlers (for XLA).
macro_rules! declare_ops {
    ($($op:ident: $attrs:ident ($($arg:ident),*) -> ($($ret:ident),*)
        { $($field:ident: $ty:ty),* $(,)? } $(host_only $why:ident)? $(started $started:ident)?),*
        $(,)?) => {
        /// Each op's attributes, typed.
        pub mod attrs {
            use crate::xla::frame::{
                Address, Attr, Attrs, Call, Counts, Devices, Shown, Sizes, Tree,
            };
            use crate::{Comm, Peer, ReduceOp, Result};
            $(
                pub struct $attrs { $(pub $field: $ty),* }
                impl Attrs for $attrs {
                    fn decode(call: &Call) -> Result<Self> {
                        Ok($attrs { $($field: <$ty as Attr>::decode(call, stringify!($field))?),* })
                    }
                    fn comm(&self) -> Option<Comm> {
                        None $(.or(Attr::as_comm(&self.$field)))*
                    }
                    fn status(&self) -> Option<Address> {
                        None $(.or(Attr::as_status(&self.$field)))*
                    }
                }
            )*
        }

        /// Every op's signature, in declaration order (each started form is its op's).
        pub const SIGNATURES: &[Signature] = &[$(Signature {
            name: stringify!($op),
            operands: &[$(stringify!($arg)),*],
            results: &[$(stringify!($ret)),*],
            attrs: &[$(AttrDecl { name: stringify!($field), kind: <$ty as Attr>::KIND }),*],
            started: started_name!($($started)?),
            host_only: signature::host_only_reason!($($why)?),
        }),*];

        /// `jaxmpi_<op>` for every op: the FFI target names the Python lowerings call.
        pub mod exported {
            use super::*;
            $(
                /// # Safety
                /// Called by XLA with a valid call frame.
                pub unsafe extern "C" fn $op(frame: *mut CallFrame) -> *mut FfiError {
                    // SAFETY: XLA passes a valid frame.
                    unsafe { handle(frame, stringify!($op), false, Platform::Cpu, ops::$op) }
                }
                $(
                    /// # Safety
                    /// Called by XLA with a valid call frame.
                    pub unsafe extern "C" fn $started(frame: *mut CallFrame) -> *mut FfiError {
                        fn body(
                            call: &Call,
                            library: &dyn Library,
                            backend: &dyn Backend,
                            attrs: &attrs::$attrs,
                        ) -> Result<()> {
                            nonblocking::start(call, library, backend, attrs, ops::$op)
                        }
                        // SAFETY: XLA passes a valid frame.
                        unsafe { handle(frame, stringify!($started), true, Platform::Cpu, body) }
                    }
                )?
            )*
        }

        /// The same targets for GPU buffers, of the ops that run there (no `host_only`
        /// reason; no started form): each call runs on XLA's stream through the installed
        /// GPU runtime.
        pub mod exported_gpu {
            use super::*;
            $(
                signature::on_gpu! { [$($why)?]
                    /// # Safety
                    /// Called by XLA with a valid call frame.
                    pub unsafe extern "C" fn $op(frame: *mut CallFrame) -> *mut FfiError {
                        fn body(
                            call: &Call,
                            library: &dyn Library,
                            _host: &dyn Backend,
                            attrs: &attrs::$attrs,
                        ) -> Result<()> {
                            let comm = Attrs::comm(attrs);
                            gpu::on_gpu(call, library, comm, &mut |backend| {
                                ops::$op(call, library, backend, attrs)
                            })
                        }
                        // SAFETY: XLA passes a valid frame.
                        unsafe { handle(frame, stringify!($op), false, Platform::Gpu, body) }
                    }
                }
            )*
        }

        /// (FFI target name, handler) for every op.
        pub const HANDLERS: &[(&str, Handler)] = &[$(
            (concat!("jaxmpi_", stringify!($op)), exported::$op as Handler),
            $((concat!("jaxmpi_", stringify!($started)), exported::$started as Handler),)?
        )*];
        /// (FFI target name, handler) for every op that runs on GPU buffers (the host
        /// handler's name): the CUDA table.
        pub const GPU_HANDLERS: &[(&str, Handler)] =
            signature::gpu_handlers!([] $($op [$($why)?])*);
    };
}
pub(super) use declare_ops;

/// The items that follow for an op that runs on GPU buffers (`[]`: its row gives no
/// `host_only` reason); nothing for one that cannot.
macro_rules! on_gpu {
    ([] $($item:item)*) => {
        $($item)*
    };
    ([$why:ident] $($item:item)*) => {};
}
pub(super) use on_gpu;

/// `GPU_HANDLERS`' entries, `op [reason]` by `op [reason]`: one for each op without a
/// `host_only` reason, in declaration order.
macro_rules! gpu_handlers {
    ([$($entry:expr,)*]) => {
        &[$($entry),*]
    };
    ([$($entry:expr,)*] $op:ident [] $($rest:tt)*) => {
        signature::gpu_handlers!(
            [$($entry,)* (concat!("jaxmpi_", stringify!($op)), exported_gpu::$op as Handler),]
            $($rest)*
        )
    };
    ([$($entry:expr,)*] $op:ident [$why:ident] $($rest:tt)*) => {
        signature::gpu_handlers!([$($entry,)*] $($rest)*)
    };
}
pub(super) use gpu_handlers;

/// An op's `host_only` reason in its signature: "" where it has none (it runs on GPUs).
macro_rules! host_only_reason {
    () => {
        ""
    };
    ($why:ident) => {
        $why
    };
}
pub(super) use host_only_reason;

/// An op's `started` name in its signature: "" where it has none.
macro_rules! started_name {
    () => {
        ""
    };
    ($started:ident) => {
        stringify!($started)
    };
}
pub(super) use started_name;
