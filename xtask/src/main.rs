//! `cargo xtask`: project chores.
//!
//! - `cargo xtask ptx --update [--arch sm_90]`: builds every committed kernel
//!   crate (`devcomm-kernels` → `host/ptx/devcomm_kernels.<arch>.ptx`, the
//!   examples' → `examples/ptx/`, the test kernels' → `tests/kernels/ptx/`,
//!   the user-style test crate's → `tests/user-kernels/ptx/`) with the
//!   nightly toolchain and writes the files with their header (toolchain,
//!   recipe, inputs hash). Run it after changing the device or a kernel crate.
//! - `cargo xtask ptx --check`: fails when a committed PTX is stale (its
//!   inputs hash does not match the tree); where the toolchain it records is
//!   installed with `rust-src`, also rebuilds it and compares the bytes. CI
//!   runs this.
//! - `cargo xtask ptx [--out PATH]`: builds the library's PTX from source to
//!   `target/ptx/devcomm_kernels.ptx` (or `PATH`), e.g. for
//!   `DEVCOMM_PTX_PATH`.
//! - `cargo xtask bundle [--dir .device]`: builds the release test binaries,
//!   the examples, `devcomm-run` and the benchmarks, and copies them with the
//!   PTX into `.device/` for a GPU machine. It refuses binaries whose
//!   embedded PTX (the library's, or the test kernels' that test and
//!   benchmark binaries carry) is missing or differs from the bundle's.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use clap::{Parser, Subcommand};
use devcomm_build::committed::{self, Freshness, Origin, Sources, ALL_COMMITTED, LIBRARY_KERNELS, TEST_KERNELS};
use devcomm_build::{PtxArtifact, PtxBuilder};

/// Test targets that test the build itself (they run cargo or read the
/// source tree), left out of bundles.
const BUILD_ONLY_TESTS: &[&str] = &["committed_ptx", "committed"];

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
    /// Build the library's kernels (`devcomm-kernels`) to one PTX module; refresh or check every committed PTX.
    Ptx {
        #[command(flatten)]
        ptx: PtxArgs,
        /// Where to copy the PTX (default: `<target dir>/ptx/devcomm_kernels.ptx`).
        #[arg(long, conflicts_with_all = ["update", "check"])]
        out: Option<PathBuf>,
        /// Write every committed PTX (`host/ptx/devcomm_kernels.<arch>.ptx`, the examples', the test
        /// kernels' `tests/kernels/ptx/devcomm_test_kernels.<arch>.ptx` and the user-style test crate's
        /// `tests/user-kernels/ptx/user_kernels.<arch>.ptx`) with its header.
        #[arg(long, conflicts_with = "check")]
        update: bool,
        /// Fail unless every committed PTX is fresh (inputs hash; a byte-for-byte rebuild where its toolchain is installed).
        #[arg(long)]
        check: bool,
    },
    /// Compile every committed PTX ahead of time with `ptxas` (no GPU needed) into
    /// `<dir>/<sha256 of the PTX>.cubin`: the images `DEVCOMM_CUBIN_DIR` loads instead of
    /// the PTX, so a GPU machine skips the driver's compilation (minutes a call).
    Cubin {
        /// GPU architecture: of the committed PTX (`<stem>.<arch>.ptx`) and of the images (`ptxas -arch`).
        #[arg(long, default_value = "sm_90")]
        arch: String,
        /// The `ptxas` to run (CUDA toolkit's, or the PyPI wheel `nvidia-cuda-nvcc-cu12`'s).
        #[arg(long, default_value = "ptxas")]
        ptxas: PathBuf,
        /// The folder to write the images into (kept: images already there are not rebuilt).
        #[arg(long, default_value = "target/cubin")]
        dir: PathBuf,
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
        Cmd::Ptx { ptx, update: true, .. } => cmd_ptx_update(&ptx),
        Cmd::Ptx { ptx, check: true, .. } => cmd_ptx_check(&ptx),
        Cmd::Ptx { ptx, out, .. } => cmd_ptx(&ptx, out),
        Cmd::Bundle { ptx, dir, no_strip } => cmd_bundle(&ptx, &dir, !no_strip),
        Cmd::Cubin { arch, ptxas, dir } => cmd_cubin(&arch, &ptxas, &dir),
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

fn builder(args: &PtxArgs) -> Result<PtxBuilder> {
    builder_for(&LIBRARY_KERNELS, args)
}

fn builder_for(sources: &Sources, args: &PtxArgs) -> Result<PtxBuilder> {
    let target = target_dir()?;
    Ok(PtxBuilder::new(sources.package)
        .manifest_dir(workspace_root())
        .target_dir(target.join(devcomm_build::PTX_TARGET_SUBDIR))
        .arch(&args.arch)
        .toolchain(&args.toolchain)
        .stream_output(true))
}

fn build_ptx(args: &PtxArgs) -> Result<PtxArtifact> {
    builder(args)?.build().map_err(|e| e.to_string())
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

/// Refreshes every committed PTX ([`ALL_COMMITTED`]).
fn cmd_ptx_update(args: &PtxArgs) -> Result<()> {
    ALL_COMMITTED.iter().try_for_each(|s| ptx_update(s, args))
}

fn ptx_update(sources: &Sources, args: &PtxArgs) -> Result<()> {
    let root = workspace_root();
    let ptx = committed::build_committed(sources, &root, &builder_for(sources, args)?).map_err(|e| e.to_string())?;
    let path = sources.committed_path(&root, &args.arch);
    devcomm_build::write_if_changed(&path, &ptx.render()).map_err(|e| e.to_string())?;
    println!(
        "{}: {} kernels, built by {}, inputs {}",
        path.display(),
        devcomm_build::check_ptx(&ptx.body).map_err(|e| e.to_string())?.len(),
        ptx.toolchain,
        ptx.inputs
    );
    Ok(())
}

/// `ptxas` of every committed PTX ([`ALL_COMMITTED`]) into
/// `<dir>/<sha256 of the file>.cubin` (the hash of the text the crates
/// embed and load, so `DEVCOMM_CUBIN_DIR` finds it: `devcomm::ptx::cubin_name`,
/// tested to agree).
fn cmd_cubin(arch: &str, ptxas: &Path, dir: &Path) -> Result<()> {
    let root = workspace_root();
    let dir = if dir.is_absolute() { dir.to_path_buf() } else { root.join(dir) };
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for sources in ALL_COMMITTED {
        let ptx = sources.committed_path(&root, arch);
        let text = std::fs::read_to_string(&ptx).map_err(|e| format!("reading {}: {e}", ptx.display()))?;
        let label = committed::sha256_label(&text);
        let hex = label.strip_prefix("sha256:").unwrap_or(&label);
        let out = dir.join(format!("{hex}.cubin"));
        if out.is_file() {
            println!("{}: {} (there already)", ptx.display(), out.display());
            continue;
        }
        let t = std::time::Instant::now();
        let tmp = dir.join(format!("{hex}.cubin.part"));
        let status =
            Command::new(ptxas).args(["-arch", arch, "-O3"]).arg(&ptx).arg("-o").arg(&tmp).status().map_err(|e| {
                format!("running {} (install the CUDA toolkit's ptxas or pass --ptxas): {e}", ptxas.display())
            })?;
        if !status.success() {
            return Err(format!("{} failed on {} ({status})", ptxas.display(), ptx.display()));
        }
        std::fs::rename(&tmp, &out).map_err(|e| format!("renaming {}: {e}", tmp.display()))?;
        println!("{}: {} in {:.0} s", ptx.display(), out.display(), t.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Checks every committed PTX ([`ALL_COMMITTED`]).
fn cmd_ptx_check(args: &PtxArgs) -> Result<()> {
    ALL_COMMITTED.iter().try_for_each(|s| ptx_check(s, args))
}

fn ptx_check(sources: &Sources, args: &PtxArgs) -> Result<()> {
    let root = workspace_root();
    let b = builder_for(sources, args)?;
    let path = sources.committed_path(&root, &args.arch);
    let refresh = "refresh it with `cargo xtask ptx --update` (needs `rustup toolchain install nightly --component rust-src`) and commit it";
    let committed = match committed::freshness(sources, &root, &b).map_err(|e| e.to_string())? {
        Freshness::Fresh(c) => c,
        Freshness::Stale { committed, expected } => {
            return Err(format!(
                "{} is stale: it was built from inputs {}, the tree's are {expected} (a kernel or device source, \
                 their manifests or Cargo.lock entries, or the recipe changed); {refresh}",
                path.display(),
                committed.inputs
            ))
        }
        Freshness::Missing => return Err(format!("{} does not exist; {refresh}", path.display())),
    };
    println!("{}: inputs hash matches the tree ({})", path.display(), committed.inputs);
    // Byte-for-byte: only with the very toolchain it records.
    let local = b.toolchain_version().ok();
    if local.as_deref() != Some(committed.toolchain.as_str()) || b.check_toolchain().is_err() {
        println!(
            "not rebuilt to compare bytes: it was made by `{}`, toolchain `{}` here is {}",
            committed.toolchain,
            args.toolchain,
            local.map_or_else(|| "not installed (or lacks rust-src)".to_string(), |v| format!("`{v}`"))
        );
        return Ok(());
    }
    let rebuilt = committed::build_committed(sources, &root, &b).map_err(|e| e.to_string())?;
    if rebuilt != committed {
        return Err(format!(
            "{} differs from what `{}` builds from these sources (edited by hand?); {refresh}",
            path.display(),
            committed.toolchain
        ));
    }
    println!("rebuilt with `{}`: identical", committed.toolchain);
    Ok(())
}

fn cmd_bundle(args: &PtxArgs, dir: &Path, strip: bool) -> Result<()> {
    let root = workspace_root();
    let dir = if dir.is_absolute() { dir.to_path_buf() } else { root.join(dir) };

    // The PTX the binaries embed: the committed file when it is fresh, else
    // rebuilt from source (what devcomm's and devcomm-tests' build scripts
    // do too): the library's, and the test kernels' (test and benchmark
    // binaries carry both).
    let mut embedded = Vec::new();
    for sources in [&LIBRARY_KERNELS, &TEST_KERNELS] {
        let (ptx, origin) =
            committed::resolve(sources, &root, &builder_for(sources, args)?).map_err(|e| e.to_string())?;
        if origin != Origin::Committed {
            eprintln!(
                "xtask: warning: the committed PTX of {} is stale or missing; bundling kernels built from source",
                sources.package
            );
        }
        let text = ptx.render();
        let entries = devcomm_build::check_ptx(&ptx.body).map_err(|e| e.to_string())?.len();
        embedded.push(Embedded { sources, label: committed::sha256_label(&text), text, entries, carrying: 0 });
    }

    // Test binaries of every member but xtask.
    let mut tests = cargo_executables(&["test", "--workspace", "--exclude", "xtask", "--release", "--no-run"])?;
    tests.sort();
    tests.dedup();
    // Tests of the build itself run cargo and read the source tree: they
    // belong where the build happens, not on the GPU machine.
    tests.retain(|t| {
        let name = t.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let build_only =
            BUILD_ONLY_TESTS.iter().any(|b| name.strip_prefix(b).is_some_and(|rest| rest.starts_with('-')));
        if build_only {
            eprintln!("xtask: not bundling {name}: it tests the build (runs cargo, reads the source tree)");
        }
        !build_only
    });

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

    // Every binary that carries devcomm's kernels (or the test kernels) must carry these.
    check_embedded(tests.iter().chain(&examples).chain(&bins), &mut embedded)?;

    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    for e in &embedded {
        let name = format!("{}.ptx", e.sources.file_stem);
        devcomm_build::write_if_changed(&dir.join(name), &e.text).map_err(|e| e.to_string())?;
    }
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
    let carried: Vec<String> = embedded
        .iter()
        .map(|e| format!("{} embed {} ({} kernels), all {}", e.carrying, e.sources.package, e.entries, e.label))
        .collect();
    println!(
        "{}: {} test binaries, {} examples, {} other binaries ({}); {:.1} MiB",
        dir.display(),
        tests.len(),
        examples.len(),
        bins.len(),
        carried.join("; "),
        total as f64 / (1024.0 * 1024.0)
    );
    if total > BUNDLE_LIMIT {
        pack(&dir)?;
    }
    Ok(())
}

/// Packs a bundle over [`BUNDLE_LIMIT`] into `bundle.tar.xz` inside it (the
/// binaries embed the same PTX and compress well: 552 MiB became 9 MiB);
/// `benches/gpu/common.sh` unpacks it on the device machine.
fn pack(dir: &Path) -> Result<(), String> {
    let packed = dir.with_extension("tar.xz.tmp");
    let out = std::fs::File::create(&packed).map_err(|e| format!("creating {}: {e}", packed.display()))?;
    let tar = Command::new("tar")
        .args(["-cf", "-", "-C"])
        .arg(dir)
        .arg(".")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("running tar: {e}"))?;
    let xz = Command::new("xz")
        // One block with a dictionary larger than a few binaries: the copies
        // of the PTX that every binary embeds compress to almost nothing
        // (2026-11-26: 552 MiB → 9 MiB; `-T0 -6` cut it in blocks and gave 64).
        .args(["-T1", "--lzma2=preset=6,dict=128MiB"])
        .stdin(tar.stdout.ok_or("tar has no stdout")?)
        .stdout(out)
        .status()
        .map_err(|e| format!("running xz (install xz-utils): {e}"))?;
    if !xz.success() {
        return Err(format!("xz failed packing {}", dir.display()));
    }
    std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let target = dir.join("bundle.tar.xz");
    std::fs::rename(&packed, &target).map_err(|e| format!("moving {}: {e}", packed.display()))?;
    let size = std::fs::metadata(&target).map_err(|e| e.to_string())?.len();
    println!(
        "{}: over 64 MiB, packed into bundle.tar.xz ({:.1} MiB; benches/gpu/common.sh unpacks it)",
        dir.display(),
        size as f64 / (1024.0 * 1024.0)
    );
    if size > BUNDLE_LIMIT {
        return Err(format!(
            "{} is {size} bytes even packed, over the 64 MiB the device machine takes",
            target.display()
        ));
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
        // `cargo test --no-run` also reports the binaries that integration
        // tests run (devcomm-run, examples): only test harnesses are tests.
        let is_test_harness = msg["profile"]["test"] == true;
        if is_build_script || (args.first() == Some(&"test") && !is_test_harness) {
            continue;
        }
        if let Some(exe) = msg["executable"].as_str() {
            exes.push(PathBuf::from(exe));
        }
    }
    Ok(exes)
}

/// PTX that binaries embed behind a marker line (`Sources::embedded`), as
/// the bundle expects it.
struct Embedded {
    sources: &'static Sources,
    /// The rendered committed PTX, as the bundle ships it.
    text: String,
    /// `sha256:<hex>` of `text`: what the binaries' marker must say.
    label: String,
    /// Kernels in it.
    entries: usize,
    /// Binaries found to embed it.
    carrying: usize,
}

/// Checks that every binary that embeds kernels behind a marker embeds
/// the ones `expected` labels (and no kernel crate the bundle does not
/// know); counts in `expected` how many embed each.
fn check_embedded<'a>(exes: impl Iterator<Item = &'a PathBuf>, expected: &mut [Embedded]) -> Result<()> {
    for exe in exes {
        let labels = embedded_ptx_labels(exe)?;
        for e in expected.iter_mut() {
            e.carrying += usize::from(labels.iter().any(|(p, _)| p == e.sources.package));
        }
        for (package, l) in &labels {
            let Some(e) = expected.iter().find(|e| e.sources.package == package) else {
                return Err(format!(
                    "{} embeds PTX of `{package}` ({l}), a kernel crate that the bundle does not check",
                    exe.display()
                ));
            };
            if *l != e.label {
                return Err(format!(
                    "{} embeds {package} kernels labelled `{l}`, not the bundle's `{}`: {}",
                    exe.display(),
                    e.label,
                    if l.starts_with("none") {
                        "it was built without PTX (unset DEVCOMM_SKIP_PTX and rebuild)"
                    } else {
                        "a stale build of the crate that embeds them? run `cargo clean --release -p devcomm -p \
                         devcomm-tests` and bundle again"
                    }
                ));
            }
        }
    }
    Ok(())
}

/// The kernel crates and labels of the PTX a binary embeds: the text after
/// each `// devcomm-embedded-ptx ` marker (the library's kernels) or
/// `// devcomm-embedded-ptx(<package>) ` marker, up to the end of its line.
fn embedded_ptx_labels(exe: &Path) -> Result<Vec<(String, String)>> {
    let bytes = std::fs::read(exe).map_err(|e| format!("reading {}: {e}", exe.display()))?;
    Ok(marker_labels(&bytes))
}

/// [`embedded_ptx_labels`] of the bytes of a binary.
fn marker_labels(bytes: &[u8]) -> Vec<(String, String)> {
    let marker = committed::EMBEDDED_MARKER.as_bytes();
    let mut labels = Vec::new();
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(marker.len()).position(|w| w == marker) {
        let mut start = at + i + marker.len();
        at = start;
        // `(<package>)` names a kernel crate other than the library's.
        let package = match bytes.get(start) {
            Some(b'(') => {
                let Some(len) = bytes[start + 1..].iter().take(65).position(|&b| b == b')') else {
                    continue;
                };
                let name = &bytes[start + 1..start + 1 + len];
                if name.is_empty() || !name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_') {
                    continue;
                }
                start += len + 2;
                String::from_utf8_lossy(name).into_owned()
            }
            _ => LIBRARY_KERNELS.package.to_string(),
        };
        if bytes.get(start) != Some(&b' ') {
            continue;
        }
        start += 1;
        let end = bytes[start..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |n| start + n);
        let label = String::from_utf8_lossy(&bytes[start..end]).into_owned();
        at = end;
        // Labels are `sha256:<64 hex digits>` or `none (why)`; anything else
        // is a string that merely starts like the marker.
        let well_formed =
            label.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
                || label.starts_with("none (");
        let entry = (package, label);
        if well_formed && !labels.contains(&entry) {
            labels.push(entry);
        }
    }
    labels
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_bundle_is_packed_and_unpacks_to_the_same_files() {
        let dir = std::env::temp_dir().join(format!("xtask-pack-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tests")).unwrap();
        let body: Vec<u8> = (0..100_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        std::fs::write(dir.join("tests/a"), &body).unwrap();
        std::fs::write(dir.join("k.ptx"), b"// ptx").unwrap();
        pack(&dir).unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("bundle.tar.xz")]);
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let ok = Command::new("tar").arg("-xJf").arg(dir.join("bundle.tar.xz")).arg("-C").arg(&out).status().unwrap();
        assert!(ok.success());
        assert_eq!(std::fs::read(out.join("tests/a")).unwrap(), body);
        assert_eq!(std::fs::read(out.join("k.ptx")).unwrap(), b"// ptx");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bundling_refuses_binaries_with_other_or_no_kernels() {
        let dir = std::env::temp_dir().join(format!("xtask-embedded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = format!("sha256:{}", "ab".repeat(32));
        let other = format!("sha256:{}", "cd".repeat(32));
        let good_tests = format!("sha256:{}", "ef".repeat(32));
        let expected = || {
            Vec::from([(&LIBRARY_KERNELS, &good), (&TEST_KERNELS, &good_tests)].map(|(sources, label)| Embedded {
                sources,
                text: String::new(),
                label: label.clone(),
                entries: 0,
                carrying: 0,
            }))
        };
        let exe = |name: &str, body: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, body).unwrap();
            p
        };
        let marker =
            |label: &str| format!("\0\x7fELF...// devcomm-embedded-ptx {label}\n.version 8.0\n...").into_bytes();
        let test_marker = |package: &str, label: &str| {
            format!("...// devcomm-embedded-ptx({package}) {label}\n// devcomm-test-kernels PTX...").into_bytes()
        };
        let carrying = exe("carrying", &marker(&good));
        let plain = exe("plain", b"\0\x7fELF no kernels here");
        // A string that starts like the marker but is no label (as code that mentions it).
        let mention =
            exe("mention", b"...// devcomm-embedded-ptx \x01\x02garbage\n...// devcomm-embedded-ptx(x y) z\n");
        // A test binary: the library's kernels and the test kernels.
        let both = exe("both", &[marker(&good), test_marker("devcomm-test-kernels", &good_tests)].concat());
        let mut e = expected();
        check_embedded([&carrying, &plain, &mention, &both].into_iter(), &mut e).unwrap();
        assert_eq!((e[0].carrying, e[1].carrying), (2, 1));
        assert_eq!(
            embedded_ptx_labels(&both).unwrap(),
            [("devcomm-kernels".to_string(), good.clone()), ("devcomm-test-kernels".to_string(), good_tests.clone())]
        );

        let stale = exe("stale", &marker(&other));
        let e = check_embedded([&carrying, &stale].into_iter(), &mut expected()).unwrap_err();
        assert!(e.contains("stale") && e.contains(&other), "{e}");
        let none = exe("none", &marker("none (DEVCOMM_SKIP_PTX)"));
        let e = check_embedded([&none].into_iter(), &mut expected()).unwrap_err();
        assert!(e.contains("without PTX"), "{e}");
        // Stale test kernels, and the test kernels' label under the library's marker.
        let stale_tests = exe("stale-tests", &[marker(&good), test_marker("devcomm-test-kernels", &good)].concat());
        let e = check_embedded([&stale_tests].into_iter(), &mut expected()).unwrap_err();
        assert!(e.contains("stale") && e.contains("devcomm-test-kernels") && e.contains(&good_tests), "{e}");
        let swapped = exe("swapped", &marker(&good_tests));
        assert!(check_embedded([&swapped].into_iter(), &mut expected()).is_err());
        // A kernel crate the bundle does not know.
        let unknown = exe("unknown", &test_marker("some-kernels", &good));
        let e = check_embedded([&unknown].into_iter(), &mut expected()).unwrap_err();
        assert!(e.contains("some-kernels") && e.contains("does not check"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
