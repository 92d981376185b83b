//! `cargo xtask build --cuda`: the engine's GPU binaries, built on a machine with no GPU and
//! no system CUDA.
//!
//! CUDA 13.0's compiler, headers and libraries come from their Python wheels, installed into
//! a virtual environment in the model cache (no root needed). What the wheels lack for a
//! build is made beside them: the unversioned link names (`libcublas.so`, …) and a stub
//! `libcuda.so` (the driver's library, which only a machine with the driver has: the stub
//! defines every driver symbol cudarc links to, so the linker records the dependency; the
//! GPU machine's real driver library answers them at run time). The binaries are built into
//! a target directory of their own (`<target>/cuda`, so the CPU build is never rebuilt),
//! then stripped and compressed into `gpu/bin/` (git-ignored), which `gpu/check.sh` unpacks
//! on the GPU machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sublet_models::ModelCache;

use crate::{cargo, client_env, patches, repo_root, run};

/// The virtual environment holding the CUDA wheels, in the model cache.
const CUDA_ENV: &str = "cuda-13.0/venv";
/// The wheels, pinned: the compiler (with its NVVM), the runtime's headers and libraries,
/// and the libraries candle links (cuBLAS, cuRAND, NVRTC).
const CUDA_PACKAGES: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-nvrtc==13.0.88",
    "nvidia-cublas==13.0.2.14",
    "nvidia-curand==10.4.5.25",
];
/// The GPU the binaries are built for when no GPU is present: an H200 (Hopper, sm_90).
const DEFAULT_COMPUTE_CAP: &str = "90";
/// The binaries built, in the engine crate.
const BINARIES: &[&str] = &["gpu_check", "make_room_probe"];
/// The shared libraries cudarc links by their unversioned names.
const LINK_NAMES: &[&str] = &["cudart", "cublas", "cublasLt", "curand", "nvrtc"];

pub fn build(cache: &ModelCache, args: &[String]) -> Result<()> {
    let started = Instant::now();
    let mut compute_cap =
        std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| DEFAULT_COMPUTE_CAP.to_string());
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--cuda" => {}
            "--compute-cap" => {
                compute_cap = rest.next().context("--compute-cap needs a value")?.clone()
            }
            other => {
                bail!("build: unknown argument {other:?} (usage: build --cuda [--compute-cap 90])")
            }
        }
    }
    if !args.iter().any(|a| a == "--cuda") {
        bail!("build: only `build --cuda` is a build of its own (the CPU build is cargo's)");
    }

    let venv = cache.path(CUDA_ENV);
    client_env::ensure_venv(
        &venv,
        CUDA_PACKAGES,
        &["--progress-bar", "off"],
        "CUDA 13.0 (wheels)",
    )?;
    let toolkit = toolkit_root(&venv)?;
    eprintln!("build: CUDA toolkit at {}", toolkit.display());
    make_link_names(&toolkit)?;
    make_driver_stub(&toolkit)?;

    let target = target_dir().join("cuda");
    let mut command = cargo();
    command
        .args([
            "build",
            "--release",
            "-p",
            "sublet-engine",
            "--features",
            "cuda",
        ])
        .args(BINARIES.iter().flat_map(|b| ["--bin", b]))
        .env("CARGO_TARGET_DIR", &target)
        .env("CUDA_HOME", &toolkit)
        .env("CUDA_PATH", &toolkit)
        .env("CUDA_ROOT", &toolkit)
        .env("CUDA_COMPUTE_CAP", &compute_cap)
        .env("CUDARC_CUDA_VERSION", "13000")
        .env("PATH", prepend_path(&toolkit.join("bin"), "PATH")?)
        .env(
            "LIBRARY_PATH",
            prepend_path(&toolkit.join("lib/stubs"), "LIBRARY_PATH")?,
        );
    eprintln!(
        "build: cargo build --features cuda (sm_{compute_cap}) into {}: nvcc compiles candle's and mistral.rs's kernels first (tens of minutes on 2 cores, once)",
        target.display()
    );
    run(command)?;

    let out = repo_root().join("gpu/bin");
    std::fs::create_dir_all(&out)?;
    let mut carried = 0u64;
    for bin in BINARIES {
        let built = target.join("release").join(bin);
        let packed = out.join(format!("{bin}.xz"));
        let stripped = out.join(bin);
        std::fs::copy(&built, &stripped).with_context(|| format!("copying {}", built.display()))?;
        let mut strip = Command::new("strip");
        strip.arg(&stripped);
        patches::output_of(strip, "strip")?;
        let _ = std::fs::remove_file(&packed);
        let mut xz = Command::new("xz");
        xz.args(["-9", "-T2", "-f"]).arg(&stripped);
        patches::output_of(xz, "xz")?;
        let size = std::fs::metadata(&packed)?.len();
        carried += size;
        eprintln!(
            "build: {} ({:.1} MiB)",
            packed.display(),
            size as f64 / (1 << 20) as f64
        );
    }
    // The bundled model's tokenizer and chat template, for the models gpu/check.sh makes.
    let mut tokenizer = crate::cargo_run("sublet-engine", "gpu_check")?;
    tokenizer
        .arg("tokenizer")
        .arg("--from")
        .arg(cache.llm_gguf()?)
        .arg("--out")
        .arg(out.join("tokenizer.gguf"));
    run(tokenizer)?;
    carried += std::fs::metadata(out.join("tokenizer.gguf"))?.len();
    let commit = patches::git_run(&repo_root(), &["rev-parse", "--short", "HEAD"])
        .map(|c| c.trim().to_string())
        .unwrap_or_default();
    std::fs::write(out.join("COMMIT"), commit)?;
    eprintln!(
        "build: done in {:.1} min; {:.1} MiB to carry in gpu/bin (the device takes 64 MiB in all)",
        started.elapsed().as_secs_f64() / 60.0,
        carried as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// The folder the wheels unpack CUDA into (`site-packages/nvidia/cu13`).
fn toolkit_root(venv: &Path) -> Result<PathBuf> {
    let lib = venv.join("lib");
    for entry in std::fs::read_dir(&lib).with_context(|| format!("reading {}", lib.display()))? {
        let root = entry?.path().join("site-packages/nvidia/cu13");
        if root.join("bin/nvcc").is_file() {
            return Ok(root);
        }
    }
    bail!("no nvidia/cu13/bin/nvcc under {}", lib.display())
}

/// `libX.so` beside each `libX.so.N` the wheels ship, for the linker's `-lX`.
fn make_link_names(toolkit: &Path) -> Result<()> {
    let lib = toolkit.join("lib");
    for name in LINK_NAMES {
        let link = lib.join(format!("lib{name}.so"));
        if link.exists() {
            continue;
        }
        let versioned = std::fs::read_dir(&lib)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|f| f.starts_with(&format!("lib{name}.so.")))
            .with_context(|| format!("no lib{name}.so.* in {}", lib.display()))?;
        std::os::unix::fs::symlink(&versioned, &link)?;
    }
    Ok(())
}

/// `lib/stubs/libcuda.so` (soname `libcuda.so.1`, the driver's), defining every driver
/// function of the cudarc versions in the build.
fn make_driver_stub(toolkit: &Path) -> Result<()> {
    let stubs = toolkit.join("lib/stubs");
    let library = stubs.join("libcuda.so");
    if library.is_file() {
        return Ok(());
    }
    std::fs::create_dir_all(&stubs)?;
    let mut symbols = std::collections::BTreeSet::new();
    for sys in cudarc_driver_bindings()? {
        let text = std::fs::read_to_string(&sys)?;
        symbols.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("pub unsafe fn "))
                .filter_map(|l| l.split('(').next())
                .filter(|name| name.starts_with("cu"))
                .map(str::to_owned),
        );
    }
    if symbols.is_empty() {
        bail!("found no driver functions in cudarc's bindings");
    }
    // CUDA_ERROR_STUB_LIBRARY (34): what NVIDIA's own stub answers if it is ever run.
    let source: String = symbols
        .iter()
        .map(|s| format!("int {s}(void) {{ return 34; }}\n"))
        .collect();
    let c = stubs.join("libcuda-stub.c");
    std::fs::write(&c, source)?;
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&library)
        .arg(&c);
    patches::output_of(cc, "cc (the driver stub)")?;
    eprintln!("build: driver stub with {} functions", symbols.len());
    Ok(())
}

/// cudarc's driver bindings (`src/driver/sys/mod.rs`) of every cudarc in the lock file.
fn cudarc_driver_bindings() -> Result<Vec<PathBuf>> {
    let output = cargo()
        .args([
            "metadata",
            "--format-version",
            "1",
            "--features",
            "sublet-engine/cuda",
        ])
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        bail!("cargo metadata failed ({})", output.status);
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let found: Vec<PathBuf> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"] == "cudarc")
        .filter_map(|p| p["manifest_path"].as_str())
        .map(|m| Path::new(m).with_file_name("src/driver/sys/mod.rs"))
        .filter(|p| p.is_file())
        .collect();
    if found.is_empty() {
        bail!("cudarc's sources are not in cargo's registry (run `cargo fetch`)");
    }
    Ok(found)
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

fn prepend_path(dir: &Path, var: &str) -> Result<std::ffi::OsString> {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(old) = std::env::var_os(var) {
        paths.extend(std::env::split_paths(&old));
    }
    Ok(std::env::join_paths(paths)?)
}
