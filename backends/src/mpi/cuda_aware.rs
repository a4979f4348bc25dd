//! Whether to hand GPU pointers to MPI (`JAXMPI_CUDA_AWARE`), decided once per process
//! from the user's setting, the library's own answer and the usual environment hints. No
//! single source is reliable, so the rule leans towards staging: staging is always correct,
//! GPU pointers to an MPI that cannot take them crash.
//!
//! The rule, first match wins:
//! 1. `JAXMPI_CUDA_AWARE=1` or `0`: the user's choice.
//! 2. A hint that switches the library's GPU support off (e.g. `OMPI_MCA_opal_cuda_support=0`):
//!    stage, whatever the library was built with.
//! 3. The library's query (`MPIX_GPU_query_support`, `MPIX_Query_cuda_support`) answered: its
//!    answer, even against a hint that says on (the hint may be meant for another MPI).
//! 4. No query: a hint that switches GPU support on (e.g. Cray's `MPICH_GPU_SUPPORT_ENABLED=1`).
//! 5. Otherwise stage.
//!
//! Decided by rules 2-4 (`auto`), GPU pointers go to MPI only for buffers that legacy
//! CUDA IPC can share, and the rest are staged: within a node CUDA-aware MPIs move GPU
//! buffers with CUDA IPC (`cuIpcGetMemHandle`: Open MPI's smcuda, MPICH's IPC cache, Intel
//! MPI, older UCX cuda_ipc), which fails on memory from CUDA's virtual memory management
//! (`cuMemCreate`) and from stream-ordered pools (`cudaMallocAsync`), and XLA's allocator
//! hands out such memory (openxla/xla#43125). The user's `JAXMPI_CUDA_AWARE=1` passes
//! every buffer: it says that this MPI takes them.

use jaxmpi_core::{Error, Result};

/// The env variable that overrides the decision.
pub const SETTING: &str = "JAXMPI_CUDA_AWARE";

/// What the library said when asked after `MPI_Init`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibraryAnswer {
    /// The named query returned this.
    Answered {
        query: &'static str,
        supported: bool,
    },
    /// The library exports neither query.
    NoQuery,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaAware {
    pub aware: bool,
    /// Whether, CUDA-aware, only buffers legacy CUDA IPC can share go to MPI directly
    /// (decided by `auto`), rather than every buffer (the user's `1`).
    pub checks_buffers: bool,
    /// Why, in words, for `python -m jaxmpi info`.
    pub reason: String,
}

/// What `auto` does with a CUDA-aware MPI, appended to the reason.
pub const PER_BUFFER: &str = "; auto passes GPU pointers only for buffers that legacy CUDA \
     IPC can share and stages the others (XLA's allocator makes buffers from cuMemCreate or \
     cudaMallocAsync, which CUDA-aware MPIs cannot share between ranks of a node); \
     JAXMPI_CUDA_AWARE=1 passes every buffer";

/// Reads a hint's value the way the libraries do: MCA booleans, Cray's 0/1, Intel's 0/1/2.
/// `None` for a value no library gives a meaning to, which is then ignored.
fn switch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "2" | "true" | "yes" | "on" | "enabled" => Some(true),
        "0" | "false" | "no" | "off" | "disabled" => Some(false),
        _ => None,
    }
}

/// Decides from `setting` (the value of `JAXMPI_CUDA_AWARE`, if set), the library's answer
/// and `hints`: the (name, value) of each hint variable of this library's family that is set.
pub fn decide(
    setting: Option<&str>,
    library: LibraryAnswer,
    hints: &[(&str, &str)],
) -> Result<CudaAware> {
    let decided = |aware: bool, reason: String| {
        let reason = if aware { reason + PER_BUFFER } else { reason };
        Ok(CudaAware {
            aware,
            checks_buffers: aware,
            reason,
        })
    };
    match setting.map(str::trim) {
        None | Some("") | Some("auto") => {}
        Some(forced @ ("0" | "1")) => {
            return Ok(CudaAware {
                aware: forced == "1",
                checks_buffers: false,
                reason: format!("{SETTING}={forced} (set by the user)"),
            })
        }
        Some(other) => {
            return Err(Error::invalid_argument(
                SETTING,
                format!(
                    "unknown value {other:?}; use auto, 1 (pass GPU pointers) or 0 (stage \
                     through host memory)"
                ),
            ))
        }
    }
    let hint_said = |wanted: bool| {
        hints
            .iter()
            .find(|(_, value)| switch(value) == Some(wanted))
            .map(|(name, value)| format!("{name}={value}"))
    };
    if let Some(off) = hint_said(false) {
        return decided(
            false,
            format!("{off} switches the library's GPU support off"),
        );
    }
    let on = hint_said(true);
    match (library, on) {
        (
            LibraryAnswer::Answered {
                query,
                supported: true,
            },
            _,
        ) => decided(true, format!("{query} says the library supports CUDA")),
        (
            LibraryAnswer::Answered {
                query,
                supported: false,
            },
            on,
        ) => {
            let ignored = on
                .map(|on| format!("; {on} is set, but the library's answer wins"))
                .unwrap_or_default();
            decided(
                false,
                format!(
                    "{query} says the library has no CUDA support{ignored} \
                     ({SETTING}=1 forces GPU pointers)"
                ),
            )
        }
        (LibraryAnswer::NoQuery, Some(on)) => {
            decided(true, format!("{on} (the library has no CUDA query)"))
        }
        (LibraryAnswer::NoQuery, None) => decided(
            false,
            format!(
                "the library has no CUDA query and no GPU-support hint is set \
                 ({SETTING}=1 forces GPU pointers)"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YES: LibraryAnswer = LibraryAnswer::Answered {
        query: "MPIX_GPU_query_support",
        supported: true,
    };
    const NO: LibraryAnswer = LibraryAnswer::Answered {
        query: "MPIX_Query_cuda_support",
        supported: false,
    };
    const NONE: LibraryAnswer = LibraryAnswer::NoQuery;

    fn aware(setting: Option<&str>, library: LibraryAnswer, hints: &[(&str, &str)]) -> bool {
        decide(setting, library, hints).unwrap().aware
    }

    #[test]
    fn the_user_setting_wins_over_everything() {
        let off_hint = [("OMPI_MCA_opal_cuda_support", "0")];
        assert!(aware(Some("1"), NO, &off_hint));
        assert!(!aware(
            Some("0"),
            YES,
            &[("MPICH_GPU_SUPPORT_ENABLED", "1")]
        ));
        let forced = decide(Some("1"), NONE, &[]).unwrap();
        assert_eq!(forced.reason, "JAXMPI_CUDA_AWARE=1 (set by the user)");
        assert!(!forced.checks_buffers, "the user's 1 passes every buffer");
    }

    #[test]
    fn auto_going_direct_checks_each_buffer_and_says_so() {
        let decision = decide(None, YES, &[]).unwrap();
        assert!(decision.aware && decision.checks_buffers);
        assert!(
            decision.reason.contains("legacy CUDA IPC"),
            "{}",
            decision.reason
        );
        let staged = decide(None, NO, &[]).unwrap();
        assert!(!staged.aware && !staged.checks_buffers);
        assert!(!staged.reason.contains("legacy CUDA IPC"));
    }

    #[test]
    fn auto_or_empty_asks_the_library() {
        for setting in [None, Some(""), Some("auto"), Some(" auto ")] {
            assert!(aware(setting, YES, &[]));
            assert!(!aware(setting, NO, &[]));
        }
    }

    #[test]
    fn an_unknown_setting_is_an_error_naming_the_variable() {
        let err = decide(Some("yes please"), YES, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("JAXMPI_CUDA_AWARE"), "{err}");
        assert!(err.contains("auto, 1"), "{err}");
    }

    #[test]
    fn a_hint_switching_gpu_support_off_stages_even_when_the_library_says_yes() {
        for (name, value) in [
            ("OMPI_MCA_opal_cuda_support", "false"),
            ("MPICH_GPU_SUPPORT_ENABLED", "0"),
            ("I_MPI_OFFLOAD", "0"),
        ] {
            let decision = decide(None, YES, &[(name, value)]).unwrap();
            assert!(!decision.aware);
            assert!(
                decision.reason.starts_with(&format!("{name}={value}")),
                "{decision:?}"
            );
        }
    }

    #[test]
    fn the_library_answer_wins_over_a_hint_switching_support_on() {
        let decision = decide(None, NO, &[("OMPI_MCA_opal_cuda_support", "true")]).unwrap();
        assert!(!decision.aware);
        assert!(
            decision.reason.contains("MPIX_Query_cuda_support says"),
            "{decision:?}"
        );
        assert!(decision
            .reason
            .contains("OMPI_MCA_opal_cuda_support=true is set"));
    }

    #[test]
    fn without_a_query_a_hint_switching_support_on_decides() {
        for (name, value) in [
            ("MPICH_GPU_SUPPORT_ENABLED", "1"),
            ("I_MPI_OFFLOAD", "2"),
            ("OMPI_MCA_opal_cuda_support", "yes"),
        ] {
            let decision = decide(None, NONE, &[(name, value)]).unwrap();
            assert!(decision.aware, "{name}={value}");
            assert!(decision.reason.contains("no CUDA query"), "{decision:?}");
        }
    }

    #[test]
    fn nothing_known_stages() {
        assert!(!aware(None, NONE, &[]));
        // A value no library defines is no hint.
        assert!(!aware(None, NONE, &[("I_MPI_OFFLOAD", "maybe")]));
        assert!(aware(None, YES, &[("I_MPI_OFFLOAD", "maybe")]));
    }
}
