//! Committed PTX: fresh exactly while the sources it was made from are
//! unchanged; a stale one with no toolchain to rebuild it is an error that
//! says what to run.

use std::path::{Path, PathBuf};

use devcomm_build::committed::{self, CommittedPtx, Freshness, LIBRARY_KERNELS};
use devcomm_build::{BuildError, PtxBuilder};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// A copy of what the library's kernels are made from, and their committed
/// PTX, in a fresh directory.
fn copy_of_tree(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&root);
    let ws = workspace();
    for dir in LIBRARY_KERNELS.dirs.iter().chain([&"device/kernels", &LIBRARY_KERNELS.committed_dir]) {
        copy_dir(&ws.join(dir), &root.join(dir));
    }
    for f in LIBRARY_KERNELS.files.iter().chain([&"Cargo.lock", &"Cargo.toml"]) {
        if ws.join(f).is_file() {
            std::fs::create_dir_all(root.join(f).parent().unwrap()).unwrap();
            std::fs::copy(ws.join(f), root.join(f)).unwrap();
        }
    }
    root
}

/// Commits a PTX for `root` as `cargo xtask ptx --update` would, with a
/// made-up toolchain version (no toolchain runs).
fn commit_for(root: &Path, builder: &PtxBuilder) -> CommittedPtx {
    let toolchain = "rustc 1.0.0-nightly (0000000 2026-01-01)".to_string();
    let recipe = builder.recipe();
    let c = CommittedPtx {
        package: LIBRARY_KERNELS.package.into(),
        arch: builder.arch_name().into(),
        inputs: LIBRARY_KERNELS.fingerprint(root, &toolchain, &recipe).unwrap(),
        toolchain,
        recipe,
        body: ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{ ret; }\n".into(),
    };
    let path = LIBRARY_KERNELS.committed_path(root, builder.arch_name());
    std::fs::write(path, c.render()).unwrap();
    c
}

#[test]
fn the_repository_s_committed_ptx_is_fresh() {
    let b = PtxBuilder::new(LIBRARY_KERNELS.package);
    match committed::freshness(&LIBRARY_KERNELS, &workspace(), &b).unwrap() {
        Freshness::Fresh(c) => {
            let entries = devcomm_build::check_ptx(&c.body).unwrap();
            assert!(entries.iter().any(|e| e == "axpy_f32"), "{entries:?}");
        }
        other => panic!(
            "host/ptx/devcomm_kernels.sm_90.ptx is not fresh: run `cargo xtask ptx --update` and commit it ({:?})",
            match other {
                Freshness::Stale { expected, committed } =>
                    format!("inputs {} vs the tree's {expected}", committed.inputs),
                _ => "missing".into(),
            }
        ),
    }
}

#[test]
fn the_test_user_kernel_crate_s_committed_ptx_is_fresh() {
    use devcomm_build::committed::USER_TEST_KERNELS;
    let b = PtxBuilder::new(USER_TEST_KERNELS.package);
    match committed::freshness(&USER_TEST_KERNELS, &workspace(), &b).unwrap() {
        Freshness::Fresh(c) => assert!(devcomm_build::check_ptx(&c.body).unwrap().len() >= 3),
        other => panic!(
            "tests/user-kernels/ptx/user_kernels.sm_90.ptx is not fresh: run `cargo xtask ptx --update` and commit it ({:?})",
            match other {
                Freshness::Stale { expected, committed } =>
                    format!("inputs {} vs the tree's {expected}", committed.inputs),
                _ => "missing".into(),
            }
        ),
    }
}

#[test]
fn the_test_kernel_crate_s_committed_ptx_is_fresh() {
    use devcomm_build::committed::TEST_KERNELS;
    let b = PtxBuilder::new(TEST_KERNELS.package);
    match committed::freshness(&TEST_KERNELS, &workspace(), &b).unwrap() {
        Freshness::Fresh(c) => assert!(devcomm_build::check_ptx(&c.body).unwrap().len() > 10),
        other => panic!(
            "tests/kernels/ptx/devcomm_test_kernels.sm_90.ptx is not fresh: run `cargo xtask ptx --update` and commit it ({:?})",
            match other {
                Freshness::Stale { expected, committed } =>
                    format!("inputs {} vs the tree's {expected}", committed.inputs),
                _ => "missing".into(),
            }
        ),
    }
}

#[test]
fn a_changed_kernel_source_makes_the_committed_ptx_stale() {
    let root = copy_of_tree("freshness");
    let b = PtxBuilder::new(LIBRARY_KERNELS.package).toolchain("devcomm-test-no-such-toolchain");
    let committed = commit_for(&root, &b);
    assert_eq!(committed::freshness(&LIBRARY_KERNELS, &root, &b).unwrap(), Freshness::Fresh(committed.clone()));
    // The committed file resolves without any toolchain.
    let (c, origin) = committed::resolve(&LIBRARY_KERNELS, &root, &b).unwrap();
    assert_eq!((c, origin), (committed.clone(), committed::Origin::Committed));

    // One byte more in a kernel source, a device source, or a device manifest.
    for changed in ["device/kernels/src/lib.rs", "device/src/lsa/mod.rs", "device/Cargo.toml"] {
        let path = root.join(changed);
        let before = std::fs::read(&path).unwrap();
        let mut after = before.clone();
        after.extend_from_slice(b"\n");
        std::fs::write(&path, &after).unwrap();
        match committed::freshness(&LIBRARY_KERNELS, &root, &b).unwrap() {
            Freshness::Stale { committed: c, expected } => {
                assert_eq!(c, committed);
                assert_ne!(expected, committed.inputs);
            }
            other => panic!("{changed} changed, yet {other:?}"),
        }
        // Stale and no toolchain: an error that says what to run.
        let e = committed::resolve(&LIBRARY_KERNELS, &root, &b).unwrap_err();
        assert!(matches!(e, BuildError::StalePtx { missing: false, .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("stale") && msg.contains("cargo xtask ptx --update") && msg.contains("rust-src"), "{msg}");
        std::fs::write(&path, &before).unwrap();
        assert!(matches!(committed::freshness(&LIBRARY_KERNELS, &root, &b).unwrap(), Freshness::Fresh(_)));
    }

    // Another recipe (architecture) or toolchain does not match either.
    let other_arch = PtxBuilder::new(LIBRARY_KERNELS.package).arch("sm_100");
    assert_eq!(committed::freshness(&LIBRARY_KERNELS, &root, &other_arch).unwrap(), Freshness::Missing);
    let mut by_other_toolchain = committed.clone();
    by_other_toolchain.toolchain = "rustc 1.0.0-nightly (1111111 2026-02-02)".into();
    std::fs::write(LIBRARY_KERNELS.committed_path(&root, "sm_90"), by_other_toolchain.render()).unwrap();
    assert!(matches!(committed::freshness(&LIBRARY_KERNELS, &root, &b).unwrap(), Freshness::Stale { .. }));
}

#[test]
fn a_dependency_outside_the_kernels_does_not_make_it_stale() {
    let root = copy_of_tree("unrelated-lock-change");
    let b = PtxBuilder::new(LIBRARY_KERNELS.package);
    commit_for(&root, &b);
    let lock = root.join("Cargo.lock");
    let mut text = std::fs::read_to_string(&lock).unwrap();
    text.push_str("\n[[package]]\nname = \"some-host-only-crate\"\nversion = \"1.0.0\"\n");
    std::fs::write(&lock, text).unwrap();
    assert!(matches!(committed::freshness(&LIBRARY_KERNELS, &root, &b).unwrap(), Freshness::Fresh(_)));
    // A missing committed file for the arch: an error naming it, not a silent library without kernels.
    std::fs::remove_file(LIBRARY_KERNELS.committed_path(&root, "sm_90")).unwrap();
    let e = committed::resolve(&LIBRARY_KERNELS, &root, &b.toolchain("devcomm-test-no-such-toolchain")).unwrap_err();
    assert!(matches!(e, BuildError::StalePtx { missing: true, .. }) && e.to_string().contains("does not exist"), "{e}");
}
