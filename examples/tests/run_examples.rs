//! Every example runs to success, as a user starts it (no launcher: it
//! starts its own ranks), on the runtime `DEVCOMM_RUNTIME` names (default
//! emulated; `cuda` on the GPU machine). `cargo test` builds the examples
//! before it runs this; a bundle (`cargo xtask bundle`) carries them.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/run_examples-<hash> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target profile directory").join("examples");
    let path = dir.join(name);
    assert!(path.is_file(), "{} is not built (run through `cargo test`, which builds the examples)", path.display());
    path
}

fn run(name: &str, expect: &str) {
    let runtime = std::env::var("DEVCOMM_RUNTIME").unwrap_or_else(|_| "emulated".into());
    let t = Instant::now();
    let out = Command::new(example(name))
        .env("DEVCOMM_RUNTIME", &runtime)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("DEVCOMM_UNIQUE_ID")
        .output()
        .expect("starting the example");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} failed ({}):\n{stdout}\n{stderr}", out.status);
    let said = format!("on the {runtime} runtime");
    assert!(stdout.contains(&said), "{name} does not say {said:?}:\n{stdout}");
    assert!(stdout.contains(expect), "{name} did not print {expect:?}:\n{stdout}");
    // Generous: the strict emulator (CI) delays stores on purpose.
    assert!(t.elapsed() < Duration::from_secs(240), "{name} took {:?}", t.elapsed());
}

#[test]
fn hello_runs() {
    run("hello", "matched the host reference");
}

#[test]
fn lsa_put_signal_runs() {
    run("lsa_put_signal", "every byte checked");
}

#[test]
fn gin_pingpong_runs() {
    run("gin_pingpong", "round trip (us)");
}

#[test]
fn put_signal_runs() {
    run("put_signal", "every element checked");
}

#[test]
fn allreduce_runs() {
    run("allreduce", "summed over");
}

#[test]
fn fused_allreduce_rmsnorm_runs() {
    run("fused_allreduce_rmsnorm", "matched the host reference");
}

#[test]
fn p2p_runs() {
    run("p2p", "every byte checked");
}

#[test]
fn moe_runs() {
    run("moe", "matched the host reference");
}
