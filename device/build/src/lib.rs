//! Build a Rust kernel crate into one self-contained PTX module.
//!
//! `devcomm-build` wraps the recipe that turns an ordinary Rust library crate
//! (`#![no_std]`, kernels declared `extern "ptx-kernel"` on `nvptx64`) into a
//! single PTX file that the CUDA driver loads as-is:
//!
//! ```text
//! RUSTFLAGS="-Ctarget-cpu=sm_90 -Clinker=/bin/true" \
//!   cargo +nightly rustc -p <package> --profile ptx --target nvptx64-nvidia-cuda \
//!   -Zbuild-std=core --crate-type cdylib -- --emit=asm
//! ```
//!
//! It is meant to be called from a `build.rs` (that is how the `devcomm` crate
//! embeds its own kernels), but works from any program, e.g. an `xtask`.
//!
//! What it takes care of:
//!
//! - **Toolchain checks** with errors that say how to fix them: the nightly
//!   toolchain and its `rust-src` component must be installed
//!   (`rustup toolchain install nightly --component rust-src`).
//! - **A clean environment** for the nested cargo: the variables cargo sets for
//!   build scripts (`RUSTC`, `RUSTC_WRAPPER`, `CARGO_ENCODED_RUSTFLAGS`,
//!   `TARGET`, `OUT_DIR`, jobserver flags, ...) are removed so they do not leak
//!   into the device build.
//! - **A target directory of its own** (by default `<target dir>/devcomm-ptx`).
//!   The outer cargo holds the lock of its target directory while build
//!   scripts run, so a nested cargo on the *same* directory would deadlock; a
//!   separate directory has its own lock, and is shared between debug and
//!   release host builds so `core` is compiled once.
//! - **The profile**: the PTX profile (default `ptx`) is defined on the command
//!   line with `inherits = "release"`, `panic = "abort"`, `lto = "fat"` and
//!   `codegen-units = 1`, so the kernel workspace does not need a
//!   `[profile.ptx]` section (settings of its own, such as `opt-level`, are
//!   kept). Fat LTO is what pulls `core`'s functions into the module; without
//!   it the PTX keeps unresolved `.extern .func` declarations that the driver
//!   rejects.
//! - **Validation** of the result with [`check_ptx`]: the module must have at
//!   least one `.entry` and no unresolved external functions.
//!
//! # Example (`build.rs`)
//!
//! ```no_run
//! use std::path::PathBuf;
//!
//! let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
//! let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
//! println!("cargo:rerun-if-changed=../my-kernels/src");
//! let ptx = devcomm_build::PtxBuilder::new("my-kernels")
//!     .manifest_dir(manifest_dir.join("../my-kernels"))
//!     .arch("sm_90")
//!     .build()
//!     .expect("building the kernels to PTX");
//! ptx.copy_to(out_dir.join("my_kernels.ptx")).unwrap();
//! ```
#![warn(missing_docs)]

pub mod committed;

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// The rustc target every PTX build uses.
pub const PTX_TARGET: &str = "nvptx64-nvidia-cuda";

/// The toolchain used when none is given.
pub const DEFAULT_TOOLCHAIN: &str = "nightly";

/// The GPU architecture used when none is given (Hopper).
pub const DEFAULT_ARCH: &str = "sm_90";

/// The PTX ISA version asked of LLVM when none is given: 8.0, the first with
/// Hopper's bulk-copy (`cp.async.bulk`) and `fence.proxy.async` instructions
/// (rustc's default for `sm_90` is 7.8). Drivers of CUDA 12.0 and later load it.
pub const DEFAULT_PTX_ISA: &str = "ptx80";

/// The cargo profile used when none is given.
pub const DEFAULT_PROFILE: &str = "ptx";

/// Name of the sub-directory of a target directory that PTX builds use by default.
pub const PTX_TARGET_SUBDIR: &str = "devcomm-ptx";

/// Functions that the CUDA driver itself provides to PTX modules ("system
/// calls"), and that may therefore appear as `.extern .func`.
const DRIVER_PROVIDED_FUNCS: &[&str] = &["vprintf", "malloc", "free", "__assertfail"];

/// The environment variables the nested cargo must not inherit.
///
/// These are set by cargo for build scripts (or by rustup for its proxies) and
/// would point the nested build at the outer build's compiler, flags, target
/// or output directory.
const REMOVED_ENV: &[&str] = &[
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTC_LINKER",
    "RUSTDOC",
    "RUSTDOCFLAGS",
    "RUSTFLAGS",
    "RUSTUP_TOOLCHAIN",
    "CARGO",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_ENCODED_RUSTDOCFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_BUILD_RUSTC",
    "CARGO_BUILD_RUSTC_WRAPPER",
    "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_BUILD_BUILD_DIR",
    "CARGO_MAKEFLAGS",
    "MAKEFLAGS",
    "MFLAGS",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_MANIFEST_LINKS",
    "CARGO_CRATE_NAME",
    "CARGO_RUSTC_CURRENT_DIR",
    "CLIPPY_ARGS",
    "CLIPPY_CONF_DIR",
    "TARGET",
    "HOST",
    "PROFILE",
    "OPT_LEVEL",
    "DEBUG",
    "OUT_DIR",
    "NUM_JOBS",
];

/// Prefixes of environment variables the nested cargo must not inherit.
const REMOVED_ENV_PREFIXES: &[&str] = &["CARGO_PKG_", "CARGO_CFG_", "CARGO_FEATURE_", "CARGO_BIN_", "DEP_", "__CARGO"];

/// Why a PTX build failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// `rustup` could not be run.
    #[error(
        "could not run `rustup` ({source}): building PTX needs rustup and a nightly toolchain; \
         install rustup from https://rustup.rs, then \
         `rustup toolchain install {toolchain} --component rust-src`"
    )]
    RustupNotFound {
        /// The toolchain that was asked for.
        toolchain: String,
        /// Why running `rustup` failed.
        #[source]
        source: io::Error,
    },
    /// The toolchain is not installed.
    #[error(
        "the Rust toolchain `{toolchain}` is not installed (it is needed to build PTX); \
         install it with `rustup toolchain install {toolchain} --component rust-src`"
    )]
    ToolchainMissing {
        /// The toolchain that was asked for.
        toolchain: String,
    },
    /// The toolchain lacks the `rust-src` component needed by `-Zbuild-std`.
    #[error(
        "the Rust toolchain `{toolchain}` has no `rust-src` component (it is needed to build \
         `core` for {PTX_TARGET}); install it with \
         `rustup component add rust-src --toolchain {toolchain}`"
    )]
    RustSrcMissing {
        /// The toolchain that was asked for.
        toolchain: String,
    },
    /// The builder was given something unusable.
    #[error("invalid PTX build configuration: {0}")]
    InvalidConfig(String),
    /// The nested cargo could not be started.
    #[error("could not run `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it could not be started.
        #[source]
        source: io::Error,
    },
    /// The nested cargo ran and failed (typically: the kernels do not compile).
    #[error("building PTX failed ({status}): `{command}`\n{stderr}")]
    CargoFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// The end of what it printed on stderr.
        stderr: String,
    },
    /// The nested cargo succeeded but the PTX file is not where it should be.
    #[error(
        "cargo succeeded but produced no PTX at {}: is the library name of the package \
         different from its package name? (set it with `PtxBuilder::lib_name`)",
        path.display()
    )]
    OutputMissing {
        /// Where the PTX was expected.
        path: PathBuf,
    },
    /// Reading or writing a file failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done ("reading", "writing", ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The committed PTX is stale (or missing) and the toolchain that would
    /// rebuild it is not installed.
    #[error(
        "{} {}, and it cannot be rebuilt here: {cause}. Either install the toolchain \
         (`rustup toolchain install nightly --component rust-src`) and build again, or, in a \
         checkout of devcomm, refresh the committed PTX with `cargo xtask ptx --update`",
        path.display(),
        if *missing { "does not exist" } else { "is stale (the kernel sources changed since it was generated)" }
    )]
    StalePtx {
        /// The committed PTX file.
        path: PathBuf,
        /// True when there is no such file at all.
        missing: bool,
        /// Why the toolchain cannot build it.
        cause: String,
    },
    /// The PTX module has no `.entry` (kernel) at all.
    #[error(
        "the PTX module has no `.entry` point: are the kernels `#[no_mangle] pub unsafe \
         extern \"ptx-kernel\" fn` on nvptx64?"
    )]
    NoEntryPoints,
    /// A `max_registers!` bound names no kernel of the module, or a count
    /// the hardware cannot give.
    #[error(
        "`max_registers!` bound `{name} = {count}`: {why} (name a kernel of this crate, \
         with a count in 16..=255)"
    )]
    BadMaxRegisters {
        /// The kernel named.
        name: String,
        /// The count asked for (as written in the PTX).
        count: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The PTX module declares functions it does not define.
    #[error(
        "the PTX module has unresolved external functions: {}; the CUDA driver will refuse to \
         load it (core's panic functions are the usual culprit: build with `lto = \"fat\"` and \
         `panic = \"abort\"`, and avoid panicking code paths in kernels)",
        names.join(", ")
    )]
    UnresolvedExterns {
        /// The names of the undefined functions (mangled).
        names: Vec<String>,
    },
}

impl BuildError {
    /// True when the failure is a missing tool (rustup, the toolchain or
    /// `rust-src`) rather than a problem with the kernels themselves.
    ///
    /// A `build.rs` that can live without PTX (as `devcomm`'s does) turns
    /// these into a warning and fails the build on any other error.
    pub fn is_toolchain_missing(&self) -> bool {
        matches!(
            self,
            BuildError::RustupNotFound { .. } | BuildError::ToolchainMissing { .. } | BuildError::RustSrcMissing { .. }
        )
    }
}

/// A PTX module built by [`PtxBuilder::build`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxArtifact {
    /// Where the PTX file is (inside the PTX target directory).
    pub path: PathBuf,
    /// The names of the kernels (`.entry` points), in module order.
    pub entries: Vec<String>,
    /// The PTX text itself.
    pub ptx: String,
}

impl PtxArtifact {
    /// Writes the PTX to `dest`, creating its parent directory. The file is
    /// left untouched when it already holds the same text, so that its
    /// modification time only changes when the PTX does.
    pub fn copy_to(&self, dest: impl AsRef<Path>) -> Result<(), BuildError> {
        write_if_changed(dest.as_ref(), &self.ptx)
    }
}

/// Writes `text` to `path` unless the file already holds exactly that text;
/// creates the parent directory. Useful to write an (empty or real) PTX file
/// from a build script without making cargo rebuild what includes it.
pub fn write_if_changed(path: &Path, text: &str) -> Result<(), BuildError> {
    if let Ok(old) = std::fs::read_to_string(path) {
        if old == text {
            return Ok(());
        }
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| BuildError::Io {
            what: "creating",
            path: parent.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| BuildError::Io { what: "writing", path: path.to_path_buf(), source })
}

/// What [`PtxBuilder::check_toolchain`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolchainInfo {
    /// The toolchain name as given (e.g. `nightly`).
    pub toolchain: String,
    /// Its sysroot.
    pub sysroot: PathBuf,
}

/// Builds one package (a kernel crate) into one PTX module.
///
/// Defaults: toolchain `nightly`, arch `sm_90`, profile `ptx`, manifest
/// directory the current directory, target directory chosen by
/// [`PtxBuilder::resolved_target_dir`].
///
/// ```no_run
/// let ptx = devcomm_build::PtxBuilder::new("my-kernels")
///     .manifest_dir("/path/to/workspace")
///     .target_dir("/path/to/workspace/target/devcomm-ptx")
///     .arch("sm_90")
///     .toolchain("nightly")
///     .build()?;
/// println!("{} has kernels {:?}", ptx.path.display(), ptx.entries);
/// # Ok::<(), devcomm_build::BuildError>(())
/// ```
#[derive(Debug, Clone)]
pub struct PtxBuilder {
    package: String,
    manifest_dir: Option<PathBuf>,
    target_dir: Option<PathBuf>,
    arch: String,
    toolchain: String,
    profile: String,
    lib_name: Option<String>,
    features: Vec<String>,
    no_default_features: bool,
    rustflags: Vec<String>,
    ptx_isa: Option<String>,
    stream_output: bool,
}

impl PtxBuilder {
    /// A builder for the package named `package` (its name in `Cargo.toml`).
    pub fn new(package: impl Into<String>) -> Self {
        PtxBuilder {
            package: package.into(),
            manifest_dir: None,
            target_dir: None,
            arch: DEFAULT_ARCH.to_string(),
            toolchain: DEFAULT_TOOLCHAIN.to_string(),
            profile: DEFAULT_PROFILE.to_string(),
            lib_name: None,
            features: Vec::new(),
            no_default_features: false,
            rustflags: Vec::new(),
            ptx_isa: Some(DEFAULT_PTX_ISA.to_string()),
            stream_output: false,
        }
    }

    /// The PTX ISA version as an LLVM target feature (`ptx78`, `ptx80`, ...),
    /// or `None` for rustc's default for the architecture. Default:
    /// [`DEFAULT_PTX_ISA`].
    pub fn ptx_isa(mut self, isa: Option<&str>) -> Self {
        self.ptx_isa = isa.map(str::to_string);
        self
    }

    /// The directory holding the `Cargo.toml` to build from: the package's own
    /// directory or its workspace root (default: the current directory).
    pub fn manifest_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.manifest_dir = Some(dir.into());
        self
    }

    /// The cargo target directory of the PTX build. It must differ from the
    /// target directory of a cargo that is running this code (see the crate
    /// documentation). Default: [`PtxBuilder::resolved_target_dir`].
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.target_dir = Some(dir.into());
        self
    }

    /// The GPU architecture, as `-Ctarget-cpu` takes it (`sm_80`, `sm_90`, ...).
    pub fn arch(mut self, arch: impl Into<String>) -> Self {
        self.arch = arch.into();
        self
    }

    /// The rustup toolchain (default `nightly`); it needs `rust-src`.
    pub fn toolchain(mut self, toolchain: impl Into<String>) -> Self {
        self.toolchain = toolchain.into();
        self
    }

    /// The cargo profile (default `ptx`). Whatever its name, it is given
    /// `inherits = "release"`, `panic = "abort"`, `lto = "fat"` and
    /// `codegen-units = 1` on the command line.
    pub fn profile(mut self, profile: impl Into<String>) -> Self {
        self.profile = profile.into();
        self
    }

    /// The library's crate name when it is not the package name with `-`
    /// replaced by `_` (i.e. when `[lib] name = ...` is set).
    pub fn lib_name(mut self, name: impl Into<String>) -> Self {
        self.lib_name = Some(name.into());
        self
    }

    /// Enables a cargo feature of the package (may be called several times).
    pub fn feature(mut self, feature: impl Into<String>) -> Self {
        self.features.push(feature.into());
        self
    }

    /// Disables the package's default features.
    pub fn no_default_features(mut self) -> Self {
        self.no_default_features = true;
        self
    }

    /// Adds a rustc flag for the device build, after `-Ctarget-cpu` and
    /// `-Clinker` (may be called several times).
    pub fn rustflag(mut self, flag: impl Into<String>) -> Self {
        self.rustflags.push(flag.into());
        self
    }

    /// Whether the nested cargo prints straight to this process's stderr as it
    /// goes (good for command-line tools) instead of being captured and
    /// printed once it is done (the default, good for build scripts).
    pub fn stream_output(mut self, yes: bool) -> Self {
        self.stream_output = yes;
        self
    }

    /// The GPU architecture this builder targets (`sm_90`).
    pub fn arch_name(&self) -> &str {
        &self.arch
    }

    /// How this builder turns sources into PTX, without paths: the rustc
    /// flags, the profile settings and the cargo options that change the
    /// output. Part of a committed PTX file's inputs hash.
    pub fn recipe(&self) -> String {
        let mut parts = vec![format!("-Ctarget-cpu={}", self.arch)];
        if let Some(isa) = &self.ptx_isa {
            parts.push(format!("-Ctarget-feature=+{isa}"));
        }
        parts.extend(self.rustflags.iter().cloned());
        parts.push(format!(
            "--profile {} (inherits release; panic abort; lto fat; codegen-units 1) -Zbuild-std=core \
             --crate-type cdylib --emit=asm",
            self.profile
        ));
        if !self.features.is_empty() {
            parts.push(format!("--features {}", self.features.join(",")));
        }
        if self.no_default_features {
            parts.push("--no-default-features".into());
        }
        parts.join(" ")
    }

    /// The toolchain's sysroot (whether or not it has `rust-src`).
    pub fn sysroot(&self) -> Result<PathBuf, BuildError> {
        Ok(PathBuf::from(self.rustc_output(&["--print", "sysroot"])?))
    }

    fn rustc_output(&self, args: &[&str]) -> Result<String, BuildError> {
        let tc = &self.toolchain;
        let out = self
            .rustup_command()
            .args([tc.as_str(), "rustc"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| BuildError::RustupNotFound { toolchain: tc.clone(), source })?;
        if !out.status.success() {
            return Err(BuildError::ToolchainMissing { toolchain: tc.clone() });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The toolchain's version as `rustc --version` prints it (e.g.
    /// `rustc 1.97.0-nightly (e50aa6fba 2026-05-19)`).
    pub fn toolchain_version(&self) -> Result<String, BuildError> {
        self.rustc_output(&["--version"])
    }

    /// The directory holding the manifest the build starts from.
    pub fn resolved_manifest_dir(&self) -> PathBuf {
        match &self.manifest_dir {
            Some(d) => d.clone(),
            None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
        }
    }

    /// The target directory the build will use: the one given with
    /// [`PtxBuilder::target_dir`]; else `$DEVCOMM_PTX_TARGET_DIR`; else
    /// `$CARGO_TARGET_DIR/devcomm-ptx`; else, inside a build script,
    /// `<target dir of the outer build>/devcomm-ptx` (found from `OUT_DIR`);
    /// else `<manifest dir>/target/devcomm-ptx`.
    pub fn resolved_target_dir(&self) -> PathBuf {
        if let Some(d) = &self.target_dir {
            return d.clone();
        }
        if let Some(d) = env_path("DEVCOMM_PTX_TARGET_DIR") {
            return d;
        }
        if let Some(d) = env_path("CARGO_TARGET_DIR") {
            return d.join(PTX_TARGET_SUBDIR);
        }
        if let Some(out) = env_path("OUT_DIR") {
            if let Some(d) = target_dir_from_out_dir(&out, std::env::var("TARGET").ok().as_deref()) {
                return d.join(PTX_TARGET_SUBDIR);
            }
        }
        self.resolved_manifest_dir().join("target").join(PTX_TARGET_SUBDIR)
    }

    /// Where the PTX file will be once built.
    pub fn output_path(&self) -> PathBuf {
        let profile_dir = match self.profile.as_str() {
            "dev" | "test" => "debug",
            "bench" => "release",
            p => p,
        };
        let lib = self.lib_name.clone().unwrap_or_else(|| self.package.replace('-', "_"));
        self.resolved_target_dir().join(PTX_TARGET).join(profile_dir).join("deps").join(format!("{lib}.s"))
    }

    /// Checks that rustup, the toolchain and its `rust-src` component are
    /// there, without building anything.
    pub fn check_toolchain(&self) -> Result<ToolchainInfo, BuildError> {
        let tc = &self.toolchain;
        let sysroot = self.sysroot()?;
        let core = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
        if !core.is_file() {
            return Err(BuildError::RustSrcMissing { toolchain: tc.clone() });
        }
        Ok(ToolchainInfo { toolchain: tc.clone(), sysroot })
    }

    /// The nested cargo command [`PtxBuilder::build`] runs, environment
    /// included (for logging or for running it some other way).
    pub fn command(&self) -> Command {
        let mut cmd = self.rustup_command();
        let manifest = self.resolved_manifest_dir().join("Cargo.toml");
        let p = &self.profile;
        cmd.arg(&self.toolchain).arg("cargo").arg("rustc");
        cmd.arg("--manifest-path").arg(manifest);
        cmd.args(["-p", &self.package]);
        cmd.args(["--profile", p, "--target", PTX_TARGET, "-Zbuild-std=core"]);
        cmd.arg("--target-dir").arg(self.resolved_target_dir());
        cmd.args(["--crate-type", "cdylib"]);
        for (key, value) in
            [("inherits", "\"release\""), ("panic", "\"abort\""), ("lto", "\"fat\""), ("codegen-units", "1")]
        {
            let builtin = matches!(p.as_str(), "dev" | "release" | "test" | "bench");
            if builtin && key == "inherits" {
                continue;
            }
            cmd.arg("--config").arg(format!("profile.{p}.{key}={value}"));
        }
        if !self.features.is_empty() {
            cmd.arg("--features").arg(self.features.join(","));
        }
        if self.no_default_features {
            cmd.arg("--no-default-features");
        }
        cmd.args(["--", "--emit=asm"]);
        let mut flags = vec![format!("-Ctarget-cpu={}", self.arch), "-Clinker=/bin/true".to_string()];
        if let Some(isa) = &self.ptx_isa {
            flags.push(format!("-Ctarget-feature=+{isa}"));
        }
        flags.extend(self.rustflags.iter().cloned());
        cmd.env("RUSTFLAGS", flags.join(" "));
        cmd
    }

    /// Builds the package and returns the checked PTX module.
    ///
    /// Runs the toolchain checks of [`PtxBuilder::check_toolchain`] first,
    /// then the nested cargo, then [`check_ptx`] on the result.
    pub fn build(&self) -> Result<PtxArtifact, BuildError> {
        self.validate()?;
        self.check_toolchain()?;
        self.run_cargo()?;
        let mut path = self.output_path();
        if !path.is_file() {
            // A fresh fingerprint with a deleted output: clean the package and retry once.
            self.clean_package();
            self.run_cargo()?;
            path = self.output_path();
            if !path.is_file() {
                return Err(BuildError::OutputMissing { path });
            }
        }
        let ptx = std::fs::read_to_string(&path).map_err(|source| BuildError::Io {
            what: "reading",
            path: path.clone(),
            source,
        })?;
        let entries = check_ptx(&ptx)?;
        let ptx = apply_max_registers(&ptx)?;
        // With `-Clinker=/bin/true` the cdylib cargo expects (`<lib>.ptx`
        // next to the `.s`) is never written, so cargo would consider the
        // crate stale and recompile it on every call. Provide it.
        let linked = path.with_extension("ptx");
        write_if_changed(&linked, &ptx)?;
        Ok(PtxArtifact { path, entries, ptx })
    }

    fn validate(&self) -> Result<(), BuildError> {
        let bad = |s: &str| s.is_empty() || s.chars().any(char::is_whitespace);
        if bad(&self.package) {
            return Err(BuildError::InvalidConfig(format!("package name {:?} is empty or has spaces", self.package)));
        }
        if !self.arch.starts_with("sm_") || bad(&self.arch) {
            return Err(BuildError::InvalidConfig(format!(
                "arch {:?} is not of the form `sm_XX` (e.g. `sm_90`)",
                self.arch
            )));
        }
        if bad(&self.toolchain) || bad(&self.profile) {
            return Err(BuildError::InvalidConfig(format!(
                "toolchain {:?} or profile {:?} is empty or has spaces",
                self.toolchain, self.profile
            )));
        }
        Ok(())
    }

    fn run_cargo(&self) -> Result<(), BuildError> {
        let mut cmd = self.command();
        let shown = display_command(&cmd);
        cmd.stdin(Stdio::null());
        // Never let the nested cargo write to our stdout: in a build script
        // that is where `cargo:` directives go.
        cmd.stdout(Stdio::null());
        if self.stream_output {
            cmd.stderr(Stdio::inherit());
            let status = cmd.status().map_err(|source| BuildError::Spawn { command: shown.clone(), source })?;
            if !status.success() {
                return Err(BuildError::CargoFailed {
                    command: shown,
                    status,
                    stderr: "(see the output above)".into(),
                });
            }
            return Ok(());
        }
        cmd.stderr(Stdio::piped());
        let out = cmd.output().map_err(|source| BuildError::Spawn { command: shown.clone(), source })?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(BuildError::CargoFailed {
                command: shown,
                status: out.status,
                stderr: tail_lines(&stderr, 60),
            });
        }
        // In a build script: shown with `cargo build -vv`.
        eprint!("{stderr}");
        Ok(())
    }

    fn clean_package(&self) {
        let mut cmd = self.rustup_command();
        cmd.arg(&self.toolchain).args(["cargo", "clean", "-p", &self.package]);
        cmd.arg("--manifest-path").arg(self.resolved_manifest_dir().join("Cargo.toml"));
        cmd.args(["--profile", &self.profile, "--target", PTX_TARGET]);
        cmd.arg("--target-dir").arg(self.resolved_target_dir());
        let _ = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }

    /// `rustup run` with a cleaned environment.
    fn rustup_command(&self) -> Command {
        let mut cmd = Command::new("rustup");
        cmd.arg("run");
        for (key, _) in std::env::vars_os() {
            if should_remove(&key) {
                cmd.env_remove(&key);
            }
        }
        // Never download a toolchain from inside a build.
        cmd.env("RUSTUP_AUTO_INSTALL", "0");
        cmd
    }
}

fn should_remove(key: &OsString) -> bool {
    let Some(key) = key.to_str() else {
        return false;
    };
    REMOVED_ENV.contains(&key) || REMOVED_ENV_PREFIXES.iter().any(|p| key.starts_with(p))
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The target directory of a cargo build, found from a build script's
/// `OUT_DIR` (`<target>[/<triple>]/<profile>/build/<pkg>-<hash>/out`).
///
/// `target` is the build's target triple (`$TARGET`), used to step over the
/// `<triple>` directory of cross (or `--target`) builds.
pub fn target_dir_from_out_dir(out_dir: &Path, target: Option<&str>) -> Option<PathBuf> {
    // out -> <pkg>-<hash> -> build -> <profile> -> <target or triple dir>
    let dir = out_dir.ancestors().nth(4)?;
    let is_build = out_dir.ancestors().nth(2)?.file_name()? == "build";
    if !is_build {
        return None;
    }
    match (target, dir.file_name()) {
        (Some(t), Some(name)) if name == t => dir.parent().map(Path::to_path_buf),
        _ => Some(dir.to_path_buf()),
    }
}

fn display_command(cmd: &Command) -> String {
    let mut s = String::new();
    if let Some(flags) = cmd.get_envs().find(|(k, _)| *k == "RUSTFLAGS").and_then(|(_, v)| v) {
        s.push_str(&format!("RUSTFLAGS={:?} ", flags.to_string_lossy()));
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        let a = a.to_string_lossy();
        if a.contains([' ', '"']) {
            s.push_str(&format!(" '{a}'"));
        } else {
            s.push(' ');
            s.push_str(&a);
        }
    }
    s
}

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Checks a PTX module and returns the names of its kernels.
///
/// The module must have at least one `.entry` point and no `.extern .func`
/// declaration (a function it calls but does not define), except for the
/// few functions the CUDA driver provides itself (`vprintf`, `malloc`,
/// `free`, `__assertfail`). `.extern .shared` arrays (dynamic shared memory)
/// are fine.
///
/// ```
/// let ptx = "
/// .version 7.8
/// .target sm_90
/// .address_size 64
/// .extern .shared .align 16 .b8 smem[];
/// .visible .entry my_kernel(
///     .param .u64 my_kernel_param_0
/// )
/// { ret; }
/// ";
/// assert_eq!(devcomm_build::check_ptx(ptx).unwrap(), vec!["my_kernel".to_string()]);
/// ```
pub fn check_ptx(text: &str) -> Result<Vec<String>, BuildError> {
    let mut entries = Vec::new();
    let mut unresolved = Vec::new();
    for line in text.lines() {
        let line = strip_comment(line).trim();
        if line.is_empty() {
            continue;
        }
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if let Some(i) = tokens.iter().position(|t| *t == ".entry") {
            if let Some(name) = symbol_after(&tokens[i + 1..]) {
                entries.push(name);
            }
        } else if tokens.first() == Some(&".extern") {
            if let Some(i) = tokens.iter().position(|t| *t == ".func") {
                if let Some(name) = symbol_after(&tokens[i + 1..]) {
                    if !DRIVER_PROVIDED_FUNCS.contains(&name.as_str()) {
                        unresolved.push(name);
                    }
                }
            }
        }
    }
    if !unresolved.is_empty() {
        unresolved.sort();
        unresolved.dedup();
        return Err(BuildError::UnresolvedExterns { names: unresolved });
    }
    if entries.is_empty() {
        return Err(BuildError::NoEntryPoints);
    }
    Ok(entries)
}

/// The prefix of the globals that `devcomm_device::max_registers!` leaves
/// in the PTX, one per bounded kernel.
pub const MAX_REGISTERS_PREFIX: &str = "__devcomm_maxnreg_";

/// Turns each `max_registers!` global (`.global .align 4 .b8
/// __devcomm_maxnreg_<kernel>[4] = {n, ..};`, a little-endian `u32`) into a
/// `.maxnreg n` directive of the kernel's `.entry`, before its body.
///
/// ```
/// let ptx = "\
/// .visible .global .align 4 .b8 __devcomm_maxnreg_k[4] = {128};
/// .visible .entry k(
///     .param .u64 k_param_0
/// )
/// {
/// ret;
/// }
/// ";
/// let out = devcomm_build::apply_max_registers(ptx).unwrap();
/// assert!(out.contains(")\n.maxnreg 128\n{"));
/// ```
pub fn apply_max_registers(text: &str) -> Result<String, BuildError> {
    let mut bounds = Vec::new();
    for line in text.lines() {
        let line = strip_comment(line).trim();
        let Some(at) = line.find(MAX_REGISTERS_PREFIX) else { continue };
        let rest = &line[at + MAX_REGISTERS_PREFIX.len()..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let init = rest.split_once('{').and_then(|(_, r)| r.split_once('}')).map(|(v, _)| v.trim()).unwrap_or("");
        let bad = |why| BuildError::BadMaxRegisters { name: name.clone(), count: init.to_string(), why };
        let bytes: Vec<u32> = init
            .split(',')
            .map(|b| b.trim().parse::<u8>().map(u32::from))
            .collect::<Result<_, _>>()
            .map_err(|_| bad("not a u32 initializer"))?;
        if bytes.len() > 4 {
            return Err(bad("not a u32 initializer"));
        }
        let count = bytes.iter().rev().fold(0u32, |v, b| (v << 8) | b);
        if !(16..=255).contains(&count) {
            return Err(bad("count outside 16..=255"));
        }
        bounds.push((name, count));
    }
    if bounds.is_empty() {
        return Ok(text.to_string());
    }
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for (name, count) in bounds {
        let entry = lines.iter().position(|l| {
            let t: Vec<&str> = strip_comment(l).split_whitespace().collect();
            t.iter().position(|t| *t == ".entry").and_then(|i| symbol_after(&t[i + 1..])).as_deref() == Some(&name)
        });
        let Some(entry) = entry else {
            return Err(BuildError::BadMaxRegisters { name, count: count.to_string(), why: "no such kernel" });
        };
        let Some(body) = lines[entry..].iter().position(|l| l.trim() == "{").map(|i| entry + i) else {
            return Err(BuildError::BadMaxRegisters { name, count: count.to_string(), why: "the kernel has no body" });
        };
        lines.insert(body, format!(".maxnreg {count}"));
    }
    let mut out = lines.join("\n");
    if text.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

fn strip_comment(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// The symbol name in what follows `.entry`/`.func`: skips a parenthesised
/// return-value list such as `(.param .b32 func_retval0)`.
fn symbol_after(rest: &[&str]) -> Option<String> {
    let joined = rest.join(" ");
    let mut s = joined.trim_start();
    if s.starts_with('(') {
        let close = s.find(')')?;
        s = s[close + 1..].trim_start();
    }
    let name: String = s.chars().take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.')).collect();
    if name.is_empty() {
        None
    } else {
        Some(name)
    }
}

impl fmt::Display for PtxArtifact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} kernels: {})", self.path.display(), self.entries.len(), self.entries.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
.version 7.8
.target sm_90
.address_size 64

.extern .shared .align 16 .b8 __devcomm_dynamic_smem[];

	// .globl	axpy_f32
.visible .entry axpy_f32(
	.param .f32 axpy_f32_param_0
)
{
	ret;
}
.weak .entry block_sum_u64(
	.param .u64 p
)
{ ret; }
.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
"#;

    #[test]
    fn entries_found_and_shared_extern_ok() {
        assert_eq!(check_ptx(GOOD).unwrap(), vec!["axpy_f32", "block_sum_u64"]);
    }

    #[test]
    fn unresolved_func_rejected() {
        let bad = format!(
            "{GOOD}\n.extern .func _ZN4core9panicking9panic_fmt17h0E\n(\n.param .b64 p\n)\n;\n\
             .extern .func (.param .b64 func_retval0) foo(\n.param .b64 p\n);\n"
        );
        match check_ptx(&bad) {
            Err(BuildError::UnresolvedExterns { names }) => {
                assert_eq!(names, vec!["_ZN4core9panicking9panic_fmt17h0E", "foo"])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn max_registers_become_maxnreg_and_bad_ones_are_refused() {
        let ptx = |g: &str| {
            format!(
                ".version 7.8\n.target sm_90\n{g}\n.visible .entry k(\n.param .u64 k_param_0\n)\n{{\nret;\n}}\n\
                 .visible .entry k2(\n)\n{{\nret;\n}}\n"
            )
        };
        let out = apply_max_registers(&ptx(".visible .global .align 4 .b8 __devcomm_maxnreg_k2[4] = {96};")).unwrap();
        assert!(out.contains(".entry k2(\n)\n.maxnreg 96\n{"), "{out}");
        assert!(!out.contains("k(\n.param .u64 k_param_0\n)\n.maxnreg"), "only k2 is bounded");
        assert_eq!(apply_max_registers(&ptx("")).unwrap(), ptx(""));
        for (g, why) in [
            (".global .align 4 .b8 __devcomm_maxnreg_nope[4] = {64};", "no such kernel"),
            (".global .align 4 .b8 __devcomm_maxnreg_k[4] = {8};", "count outside 16..=255"),
            (".global .align 4 .b8 __devcomm_maxnreg_k[4] = {0, 1};", "count outside 16..=255"),
            (".global .align 4 .b8 __devcomm_maxnreg_k[4] = {x};", "not a u32 initializer"),
        ] {
            match apply_max_registers(&ptx(g)) {
                Err(BuildError::BadMaxRegisters { why: w, .. }) => assert_eq!(w, why, "{g}"),
                other => panic!("{g}: {other:?}"),
            }
        }
    }

    #[test]
    fn no_entry_rejected() {
        let ptx = ".version 7.8\n.target sm_90\n.visible .func helper()\n{ ret; }\n";
        assert!(matches!(check_ptx(ptx), Err(BuildError::NoEntryPoints)));
    }

    #[test]
    fn commented_lines_ignored() {
        let ptx = "// .extern .func bogus\n.entry k()\n{ ret; }\n";
        assert_eq!(check_ptx(ptx).unwrap(), vec!["k"]);
    }

    #[test]
    fn out_dir_to_target_dir() {
        let host = Path::new("/w/target/debug/build/devcomm-abc/out");
        assert_eq!(target_dir_from_out_dir(host, Some("x86_64-unknown-linux-gnu")), Some(PathBuf::from("/w/target")));
        let cross = Path::new("/w/target/aarch64-unknown-linux-gnu/release/build/devcomm-abc/out");
        assert_eq!(target_dir_from_out_dir(cross, Some("aarch64-unknown-linux-gnu")), Some(PathBuf::from("/w/target")));
        assert_eq!(target_dir_from_out_dir(Path::new("/x/out"), None), None);
    }

    #[test]
    fn output_path_and_command() {
        let b = PtxBuilder::new("my-kernels").manifest_dir("/ws").target_dir("/ws/target/devcomm-ptx").arch("sm_80");
        assert_eq!(b.output_path(), PathBuf::from("/ws/target/devcomm-ptx/nvptx64-nvidia-cuda/ptx/deps/my_kernels.s"));
        let shown = display_command(&b.command());
        assert!(shown.contains("RUSTFLAGS=\"-Ctarget-cpu=sm_80 -Clinker=/bin/true -Ctarget-feature=+ptx80\""));
        assert!(shown.contains("run nightly cargo rustc"));
        assert!(shown.contains("-Zbuild-std=core"));
        assert!(shown.contains("--crate-type cdylib"));
        assert!(shown.ends_with("-- --emit=asm"));
    }

    #[test]
    fn env_filter() {
        for k in ["RUSTC", "CARGO_CFG_UNIX", "CARGO_PKG_NAME", "OUT_DIR", "DEP_Z_INCLUDE"] {
            assert!(should_remove(&OsString::from(k)), "{k}");
        }
        for k in ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "CARGO_TARGET_NVPTX_X"] {
            assert!(!should_remove(&OsString::from(k)), "{k}");
        }
    }

    #[test]
    fn bad_config_rejected() {
        let e = PtxBuilder::new("k").arch("90").build().unwrap_err();
        assert!(matches!(e, BuildError::InvalidConfig(_)), "{e}");
    }
}
