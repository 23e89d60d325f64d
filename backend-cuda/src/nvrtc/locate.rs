//! Where NVRTC may be: an explicit path, the dynamic loader's search path,
//! a CUDA toolkit, or the `nvidia-cuda-nvrtc` Python wheels (which need no
//! toolkit: `pip install nvidia-cuda-nvrtc-cu12`).

use std::path::{Path, PathBuf};

/// The environment variable naming NVRTC's library file explicitly.
pub const ENV_NVRTC_LIB: &str = "RINGCC_NVRTC_LIB";

/// Library names the dynamic loader may resolve, newest first.
pub const SONAMES: [&str; 5] = [
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
    "libnvrtc.so.11.1",
    "libnvrtc.so",
];

/// Folders of the pip wheels below `site-packages` (CUDA 12 and 13
/// layouts).
const WHEEL_DIRS: [&str; 3] = [
    "nvidia/cu13/lib",
    "nvidia/cuda_nvrtc/lib",
    "nvidia/cu12/lib",
];

/// What the search looks at, read from the environment (or made up by a
/// test).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchEnv {
    /// `RINGCC_NVRTC_LIB`.
    pub explicit: Option<String>,
    /// `CUDA_HOME`, `CUDA_PATH`, then `/usr/local/cuda`.
    pub cuda_roots: Vec<PathBuf>,
    /// Python prefixes: `VIRTUAL_ENV`, `CONDA_PREFIX`, the parents of
    /// `PATH`'s `bin` folders, pyenv versions, `~/.local`, `/usr/local`,
    /// `/usr`.
    pub python_prefixes: Vec<PathBuf>,
}

impl SearchEnv {
    /// Reads the process environment.
    pub fn from_process() -> SearchEnv {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let mut cuda_roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
            .iter()
            .filter_map(|k| var(k).map(PathBuf::from))
            .collect();
        cuda_roots.push(PathBuf::from("/usr/local/cuda"));
        let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
            .iter()
            .filter_map(|k| var(k).map(PathBuf::from))
            .collect();
        if let Some(path) = var("PATH") {
            for dir in std::env::split_paths(&path) {
                if dir.file_name().is_some_and(|n| n == "bin") {
                    if let Some(p) = dir.parent() {
                        prefixes.push(p.to_path_buf());
                    }
                }
            }
        }
        let home = var("HOME").map(PathBuf::from);
        let pyenv = var("PYENV_ROOT")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".pyenv")));
        if let Some(versions) = pyenv.map(|p| p.join("versions")) {
            prefixes.extend(sorted_children(&versions));
        }
        if let Some(h) = home {
            prefixes.push(h.join(".local"));
        }
        prefixes.push(PathBuf::from("/usr/local"));
        prefixes.push(PathBuf::from("/usr"));
        SearchEnv {
            explicit: var(ENV_NVRTC_LIB).and_then(|v| v.into_string().ok()),
            cuda_roots,
            python_prefixes: dedup(prefixes),
        }
    }

    /// Every candidate, in the order to try: the explicit path alone if
    /// given; else the loader's names, the toolkits' `lib64`, then the
    /// wheels found on disk.
    pub fn candidates(&self) -> Vec<String> {
        if let Some(e) = &self.explicit {
            return vec![e.clone()];
        }
        let mut out: Vec<String> = SONAMES.iter().map(|s| (*s).to_owned()).collect();
        for root in &self.cuda_roots {
            for lib in ["lib64", "lib"] {
                out.extend(files_in(&root.join(lib)));
            }
        }
        for prefix in &self.python_prefixes {
            for lib in ["lib", "lib64"] {
                for py in sorted_children(&prefix.join(lib)) {
                    let is_python = py
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("python3"));
                    if !is_python {
                        continue;
                    }
                    for pkgs in ["site-packages", "dist-packages"] {
                        for w in WHEEL_DIRS {
                            out.extend(files_in(&py.join(pkgs).join(w)));
                        }
                    }
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|c| seen.insert(c.clone()));
        out
    }
}

/// NVRTC library files (`libnvrtc.so.*`, not the builtins) in `dir`.
fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = sorted_children(dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_nvrtc_file)
        })
        .filter_map(|p| p.to_str().map(str::to_owned))
        .collect();
    // Newest version first.
    v.reverse();
    v
}

/// Whether a file name is NVRTC's main library (`libnvrtc.so`,
/// `libnvrtc.so.12`, …), not `libnvrtc-builtins` nor the `.alt` variant.
pub fn is_nvrtc_file(name: &str) -> bool {
    name == "libnvrtc.so"
        || name
            .strip_prefix("libnvrtc.so.")
            .is_some_and(|v| !v.is_empty())
}

fn sorted_children(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn dedup(v: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    v.into_iter().filter(|p| seen.insert(p.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognizes_nvrtc_files() {
        assert!(is_nvrtc_file("libnvrtc.so"));
        assert!(is_nvrtc_file("libnvrtc.so.12"));
        assert!(is_nvrtc_file("libnvrtc.so.13.0.48"));
        assert!(!is_nvrtc_file("libnvrtc.so."));
        assert!(!is_nvrtc_file("libnvrtc-builtins.so.12.9"));
        assert!(!is_nvrtc_file("libnvrtc.alt.so.12"));
        assert!(!is_nvrtc_file("libnvrtc.a"));
    }

    #[test]
    fn explicit_path_wins_alone() {
        let env = SearchEnv {
            explicit: Some("/x/libnvrtc.so.12".into()),
            ..SearchEnv::default()
        };
        assert_eq!(env.candidates(), vec!["/x/libnvrtc.so.12".to_owned()]);
    }

    #[test]
    fn finds_wheels_under_a_python_prefix() {
        let root = std::env::temp_dir().join(format!("ringcc-nvrtc-{}", std::process::id()));
        let lib = root.join("lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib");
        std::fs::create_dir_all(&lib).unwrap();
        for f in [
            "libnvrtc.so.12",
            "libnvrtc-builtins.so.12.9",
            "libnvrtc.alt.so.12",
        ] {
            std::fs::write(lib.join(f), b"").unwrap();
        }
        let env = SearchEnv {
            explicit: None,
            cuda_roots: vec![],
            python_prefixes: vec![root.clone()],
        };
        let c = env.candidates();
        assert_eq!(&c[..SONAMES.len()], &SONAMES.map(str::to_owned)[..]);
        assert_eq!(
            &c[SONAMES.len()..],
            &[lib.join("libnvrtc.so.12").to_str().unwrap().to_owned()]
        );
        std::fs::remove_dir_all(root).unwrap();
    }
}
