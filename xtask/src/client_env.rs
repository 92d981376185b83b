//! The official client libraries the tests drive Sublet with, in a Python virtual
//! environment and a Node package folder inside the cache, so nothing is installed into
//! the system's Python or Node.

use std::process::Command;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

use sublet_models::{
    ModelCache, AIPERF_ENV, AIPERF_PACKAGE, LLAMA_CPP_ENV, LLAMA_CPP_PACKAGE, NODE_ENV,
    NODE_PACKAGES, PYTHON_ENV, PYTHON_PACKAGES,
};

pub fn ensure_python_env(cache: &ModelCache) -> Result<()> {
    let dir = cache.path(PYTHON_ENV);
    ensure_venv(&dir, PYTHON_PACKAGES, &["--quiet"], "test clients")
}

/// llama-cpp-python built from its source release (its build compiles llama.cpp: several
/// minutes on 2 cores, once); returns the environment's Python.
///
/// Not llama.cpp's native build (`-march=native`): on an Intel Xeon with AMX it died with
/// SIGSEGV at its first prefill. The instruction sets are named instead, those this CPU
/// has among AVX, AVX2, FMA, F16C and AVX-512 (F, VNNI, BF16), AMX never.
pub fn ensure_llama_cpp(cache: &ModelCache) -> Result<PathBuf> {
    let dir = cache.path(LLAMA_CPP_ENV);
    let cmake_args = llama_cpp_cmake_args(&cpu_flags());
    ensure_venv_with(
        &dir,
        &[LLAMA_CPP_PACKAGE],
        // Not quiet: pip's "still running" lines are the build's progress.
        &["--no-binary", "llama-cpp-python", "--progress-bar", "off"],
        "llama.cpp (built from source on first use: several minutes)",
        &[("CMAKE_ARGS", cmake_args.as_str())],
    )?;
    Ok(dir.join("bin/python"))
}

/// The CPU's feature flags, as `/proc/cpuinfo` lists them (none elsewhere).
fn cpu_flags() -> Vec<String> {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("flags"))
                .map(|l| l.split_whitespace().skip(2).map(str::to_string).collect())
        })
        .unwrap_or_default()
}

/// llama.cpp's CMake options for a CPU with `flags`: no native build, each instruction
/// set it has named, AMX left out.
fn llama_cpp_cmake_args(flags: &[String]) -> String {
    let has = |flag: &str| flags.iter().any(|f| f == flag);
    let mut args = vec!["-DGGML_NATIVE=OFF".to_string()];
    for (option, flag) in [
        ("GGML_AVX", "avx"),
        ("GGML_AVX2", "avx2"),
        ("GGML_FMA", "fma"),
        ("GGML_F16C", "f16c"),
        ("GGML_AVX512", "avx512f"),
        ("GGML_AVX512_VNNI", "avx512_vnni"),
        ("GGML_AVX512_BF16", "avx512_bf16"),
    ] {
        args.push(format!("-D{option}={}", if has(flag) { "ON" } else { "OFF" }));
    }
    args.push("-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF".into());
    args.join(" ")
}

/// AIPerf, the bench's other agent driver (about 1.2 GB with its libraries, so only
/// when a bench asks for it); returns its program.
pub fn ensure_aiperf(cache: &ModelCache) -> Result<PathBuf> {
    let dir = cache.path(AIPERF_ENV);
    ensure_venv(
        &dir,
        &[AIPERF_PACKAGE],
        &["--progress-bar", "off"],
        "AIPerf (the bench's --agent-driver aiperf)",
    )?;
    Ok(dir.join("bin/aiperf"))
}

/// A virtual environment at `dir` holding `packages` (pinned), installed by pip once.
pub(crate) fn ensure_venv(
    dir: &Path,
    packages: &[&str],
    pip_args: &[&str],
    what: &str,
) -> Result<()> {
    ensure_venv_with(dir, packages, pip_args, what, &[])
}

/// [`ensure_venv`] with environment variables for pip's builds (kept in the stamp, so a
/// change rebuilds).
fn ensure_venv_with(
    dir: &Path,
    packages: &[&str],
    pip_args: &[&str],
    what: &str,
    env: &[(&str, &str)],
) -> Result<()> {
    let stamp = dir.join("sublet-packages.txt");
    let mut wanted = packages.join("\n");
    for (name, value) in env {
        wanted.push_str(&format!("\n{name}={value}"));
    }
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted)
        && dir.join("bin/python").is_file()
    {
        eprintln!("setup: {what} ok ({})", packages.join(", "));
        return Ok(());
    }
    eprintln!("setup: installing {what} into {}", dir.display());
    if !dir.join("bin/python").is_file() {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(dir)
            .status()
            .context("running python3 -m venv: is Python 3 installed?")?;
        if !status.success() {
            bail!(
                "python3 -m venv {} failed ({status}); on Debian install python3-venv",
                dir.display()
            );
        }
    }
    let status = Command::new(dir.join("bin/python"))
        .args(["-m", "pip", "install", "--disable-pip-version-check"])
        .args(pip_args)
        .args(packages)
        .env("CMAKE_BUILD_PARALLEL_LEVEL", build_jobs())
        .envs(env.iter().copied())
        .status()?;
    if !status.success() {
        bail!("pip could not install {} ({status})", packages.join(" "));
    }
    std::fs::write(stamp, wanted)?;
    Ok(())
}

/// Every core for a source build (cmake's own default is one job).
fn build_jobs() -> String {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .to_string()
}

pub fn ensure_node_env(cache: &ModelCache) -> Result<()> {
    let dir = cache.path(NODE_ENV);
    let stamp = dir.join("sublet-packages.txt");
    let wanted = NODE_PACKAGES.join("\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) && cache.node_modules().is_ok() {
        eprintln!("setup: node test clients ok ({})", NODE_PACKAGES.join(", "));
        return Ok(());
    }
    eprintln!("setup: installing node test clients into {}", dir.display());
    std::fs::create_dir_all(&dir)?;
    let status = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            "--prefix",
        ])
        .arg(&dir)
        .args(NODE_PACKAGES)
        .status()
        .context("running npm: is npm installed?")?;
    if !status.success() {
        bail!(
            "npm could not install {} ({status})",
            NODE_PACKAGES.join(" ")
        );
    }
    std::fs::write(stamp, wanted)?;
    Ok(())
}
