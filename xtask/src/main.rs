//! `cargo xtask`: project chores.
//!
//! - `cargo xtask ptx [--arch sm_90] [--toolchain nightly] [--out PATH]`: builds
//!   `devcomm-kernels` to PTX and copies it to `target/ptx/devcomm_kernels.ptx`
//!   (or `PATH`).
//! - `cargo xtask bundle [--dir .device]`: builds the release test binaries,
//!   the examples and `devcomm-run` (when it exists), and copies them with the
//!   PTX into `.device/` for a GPU machine.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use clap::{Parser, Subcommand};
use devcomm_build::{PtxArtifact, PtxBuilder};

/// Largest bundle the device machine accepts.
const BUNDLE_LIMIT: u64 = 64 * 1024 * 1024;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "devcomm project chores")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the kernels (`devcomm-kernels`) to one PTX module.
    Ptx {
        #[command(flatten)]
        ptx: PtxArgs,
        /// Where to copy the PTX (default: `<target dir>/ptx/devcomm_kernels.ptx`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Prepare a folder of release test binaries, examples and the PTX for a GPU machine.
    Bundle {
        #[command(flatten)]
        ptx: PtxArgs,
        /// The folder to (re)create.
        #[arg(long, default_value = ".device")]
        dir: PathBuf,
        /// Do not strip the binaries.
        #[arg(long)]
        no_strip: bool,
    },
}

#[derive(clap::Args)]
struct PtxArgs {
    /// GPU architecture (`-Ctarget-cpu`).
    #[arg(long, default_value = devcomm_build::DEFAULT_ARCH)]
    arch: String,
    /// Rust toolchain for the device build (needs `rust-src`).
    #[arg(long, default_value = devcomm_build::DEFAULT_TOOLCHAIN)]
    toolchain: String,
}

type Result<T, E = String> = std::result::Result<T, E>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Ptx { ptx, out } => cmd_ptx(&ptx, out),
        Cmd::Bundle { ptx, dir, no_strip } => cmd_bundle(&ptx, &dir, !no_strip),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask lives one level below it).
fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// The cargo subprocess, run from the workspace root.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// The workspace's target directory, as cargo sees it.
fn target_dir() -> Result<PathBuf> {
    let meta = cargo_metadata()?;
    meta["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| "cargo metadata has no target_directory".to_string())
}

fn cargo_metadata() -> Result<serde_json::Value> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed ({})", out.status));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("parsing cargo metadata: {e}"))
}

fn build_ptx(args: &PtxArgs) -> Result<PtxArtifact> {
    let target = target_dir()?;
    PtxBuilder::new("devcomm-kernels")
        .manifest_dir(workspace_root())
        .target_dir(target.join(devcomm_build::PTX_TARGET_SUBDIR))
        .arch(&args.arch)
        .toolchain(&args.toolchain)
        .stream_output(true)
        .build()
        .map_err(|e| e.to_string())
}

fn cmd_ptx(args: &PtxArgs, out: Option<PathBuf>) -> Result<()> {
    let ptx = build_ptx(args)?;
    let out = match out {
        Some(p) => p,
        None => target_dir()?.join("ptx").join("devcomm_kernels.ptx"),
    };
    ptx.copy_to(&out).map_err(|e| e.to_string())?;
    println!("{}", out.display());
    println!("entries: {}", ptx.entries.join(" "));
    Ok(())
}

fn cmd_bundle(args: &PtxArgs, dir: &Path, strip: bool) -> Result<()> {
    let root = workspace_root();
    let dir = if dir.is_absolute() { dir.to_path_buf() } else { root.join(dir) };

    let ptx = build_ptx(args)?;

    // Test binaries of every member but xtask.
    let mut tests = cargo_executables(&["test", "--workspace", "--exclude", "xtask", "--release", "--no-run"])?;
    tests.sort();
    tests.dedup();

    // Examples, and devcomm-run when the devcomm crate has it.
    let meta = cargo_metadata()?;
    let mut examples = Vec::new();
    if package(&meta, "devcomm-examples").is_some_and(|p| has_target(p, "example", None)) {
        examples = cargo_executables(&["build", "--release", "--examples", "-p", "devcomm-examples"])?;
    }
    let has_run_bin = package(&meta, "devcomm").is_some_and(|p| has_target(p, "bin", Some("devcomm-run")));
    let mut bins = Vec::new();
    if has_run_bin {
        bins = cargo_executables(&["build", "--release", "-p", "devcomm", "--bin", "devcomm-run"])?;
    }
    // Benchmark programs (benches/src/bin/*).
    if package(&meta, "devcomm-benches").is_some_and(|p| has_target(p, "bin", None)) {
        bins.extend(cargo_executables(&["build", "--release", "-p", "devcomm-benches", "--bins"])?);
    }

    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    ptx.copy_to(dir.join("devcomm_kernels.ptx")).map_err(|e| e.to_string())?;
    let have_strip = strip && Command::new("strip").arg("--version").output().is_ok();
    for (sub, files) in [("tests", &tests), ("examples", &examples), ("bin", &bins)] {
        for src in files {
            let name = src.file_name().ok_or_else(|| format!("no file name in {}", src.display()))?;
            let dst = dir.join(sub).join(name);
            copy_file(src, &dst)?;
            if have_strip {
                let ok = Command::new("strip").arg(&dst).status().is_ok_and(|s| s.success());
                if !ok {
                    eprintln!("xtask: warning: could not strip {}", dst.display());
                }
            }
        }
    }

    let total = dir_size(&dir)?;
    println!(
        "{}: {} test binaries, {} examples, {} other binaries, PTX with {} kernels; {:.1} MiB",
        dir.display(),
        tests.len(),
        examples.len(),
        bins.len(),
        ptx.entries.len(),
        total as f64 / (1024.0 * 1024.0)
    );
    if total > BUNDLE_LIMIT {
        return Err(format!("{} is {total} bytes, over the 64 MiB the device machine takes", dir.display()));
    }
    Ok(())
}

fn package<'a>(meta: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    meta["packages"].as_array()?.iter().find(|p| p["name"] == name)
}

/// Whether a package of `cargo metadata` has a target of this kind (and name).
fn has_target(package: &serde_json::Value, kind: &str, name: Option<&str>) -> bool {
    package["targets"].as_array().is_some_and(|ts| {
        ts.iter().any(|t| {
            name.is_none_or(|n| t["name"] == n) && t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == kind))
        })
    })
}

/// Runs a cargo build command with `--message-format=json` and returns the
/// executables it produced (build scripts excluded).
fn cargo_executables(args: &[&str]) -> Result<Vec<PathBuf>> {
    let mut cmd = cargo();
    cmd.args(args).arg("--message-format=json-render-diagnostics");
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    eprintln!("xtask: cargo {}", args.join(" "));
    let out = cmd.output().map_err(|e| format!("running cargo {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed ({})", args.join(" "), out.status));
    }
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let is_build_script = msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "custom-build"));
        if is_build_script {
            continue;
        }
        if let Some(exe) = msg["executable"].as_str() {
            exes.push(PathBuf::from(exe));
        }
    }
    Ok(exes)
}

fn copy_file(src: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    std::fs::copy(src, dst).map(drop).map_err(|e| format!("copying {} to {}: {e}", src.display(), dst.display()))
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?;
        let meta = entry.metadata().map_err(|e| format!("reading {}: {e}", entry.path().display()))?;
        total += if meta.is_dir() { dir_size(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}
