//! Where the engine runs: the CPU (any machine, the default), or a CUDA GPU with paged
//! attention (a build with the `cuda` feature: `cargo xtask build --cuda`).
//!
//! On a GPU the KV cache is a pool of blocks of a size the operator sets, in tokens or MB,
//! never "whatever the card has free": the card is shared with the processes beside the
//! engine, and the scheduler's KV budget is the pool.

use candle_core::{DType, Device};
use mistralrs_core::{MemoryGpuConfig, PagedAttentionConfig, PagedCacheType};

use crate::LoadError;

/// Tokens a KV block holds on the paged path (mistral.rs's default; its kernels take 8,
/// 16 or 32).
pub const KV_BLOCK_TOKENS: usize = 32;

/// Where the engine runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Accelerator {
    /// The CPU: F32 activations, a KV cache per sequence (mistral.rs's non-paged path).
    #[default]
    Cpu,
    /// CUDA GPU `ordinal`: BF16 activations, paged attention over a pool of `kv_pool`.
    Cuda { ordinal: usize, kv_pool: KvPool },
}

/// The size of the GPU's KV pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPool {
    /// Room for this many tokens of KV (rounded down to whole blocks).
    Tokens(usize),
    /// This many MB of the card's memory.
    Megabytes(usize),
}

impl Default for KvPool {
    /// Room for 64 sequences of 4,096 tokens.
    fn default() -> Self {
        Self::Tokens(64 * 4096)
    }
}

impl std::str::FromStr for KvPool {
    type Err = String;

    /// `262144` or `262144tok` (tokens), `4096mb` (MB).
    fn from_str(text: &str) -> Result<Self, String> {
        let lower = text.trim().to_ascii_lowercase();
        let (digits, megabytes) = match lower.strip_suffix("mb") {
            Some(digits) => (digits, true),
            None => (lower.strip_suffix("tok").unwrap_or(&lower), false),
        };
        let amount: usize = digits.parse().map_err(|_| {
            format!("KV pool {text:?}: expected tokens (e.g. 262144) or MB (e.g. 4096mb)")
        })?;
        if amount == 0 {
            return Err(format!("KV pool {text:?} is empty"));
        }
        Ok(if megabytes {
            Self::Megabytes(amount)
        } else {
            Self::Tokens(amount)
        })
    }
}

/// What mistral.rs loads with, for an [`Accelerator`].
pub(crate) struct LoadSettings {
    pub device: Device,
    pub dtype: DType,
    /// `Some` on the paged path.
    pub paged: Option<PagedAttentionConfig>,
}

impl Accelerator {
    /// From a command line's `--device cpu|cuda[:N]` and `--kv-pool` (a GPU's pool;
    /// default [`KvPool::default`]).
    pub fn from_args(device: &str, kv_pool: Option<&str>) -> Result<Self, String> {
        let kv_pool = kv_pool.map(str::parse).transpose()?.unwrap_or_default();
        match device {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda {
                ordinal: 0,
                kv_pool,
            }),
            other => match other.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(ordinal)) => Ok(Self::Cuda { ordinal, kv_pool }),
                _ => Err(format!("device {other:?}: expected cpu, cuda or cuda:N")),
            },
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self, Self::Cuda { .. })
    }

    pub(crate) fn load_settings(&self) -> Result<LoadSettings, LoadError> {
        match *self {
            Self::Cpu => Ok(LoadSettings {
                device: Device::Cpu,
                dtype: DType::F32,
                paged: None,
            }),
            Self::Cuda { ordinal, kv_pool } => {
                // Without the `cuda` feature candle answers "not compiled with CUDA support".
                let device = Device::new_cuda(ordinal).map_err(|e| LoadError::Device {
                    device: format!("cuda:{ordinal}"),
                    source: e.into(),
                })?;
                let mem_gpu = match kv_pool {
                    KvPool::Tokens(tokens) => MemoryGpuConfig::ContextSize(tokens),
                    KvPool::Megabytes(mb) => MemoryGpuConfig::MbAmount(mb),
                };
                let paged =
                    PagedAttentionConfig::new(Some(KV_BLOCK_TOKENS), mem_gpu, PagedCacheType::Auto)
                        .map_err(|e| LoadError::Device {
                            device: format!("cuda:{ordinal}"),
                            source: e.into(),
                        })?;
                Ok(LoadSettings {
                    device,
                    dtype: DType::BF16,
                    paged: Some(paged),
                })
            }
        }
    }
}

impl std::fmt::Display for Accelerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda { ordinal, .. } => write!(f, "cuda:{ordinal}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_pools_parse_in_tokens_or_megabytes() {
        assert_eq!("262144".parse(), Ok(KvPool::Tokens(262_144)));
        assert_eq!("4096tok".parse(), Ok(KvPool::Tokens(4096)));
        assert_eq!("4096MB".parse(), Ok(KvPool::Megabytes(4096)));
        assert!("0".parse::<KvPool>().is_err());
        assert!("lots".parse::<KvPool>().is_err());
    }

    #[test]
    fn devices_parse_from_the_command_line() {
        assert_eq!(Accelerator::from_args("cpu", None), Ok(Accelerator::Cpu));
        assert_eq!(
            Accelerator::from_args("cuda:1", Some("512mb")),
            Ok(Accelerator::Cuda {
                ordinal: 1,
                kv_pool: KvPool::Megabytes(512)
            })
        );
        assert_eq!(
            Accelerator::from_args("cuda", None),
            Ok(Accelerator::Cuda {
                ordinal: 0,
                kv_pool: KvPool::default()
            })
        );
        assert!(Accelerator::from_args("tpu", None).is_err());
        assert!(Accelerator::from_args("cuda", Some("0")).is_err());
    }

    /// A CPU build asked for a GPU says so, as a load error the caller can show.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_cpu_build_refuses_a_gpu_clearly() {
        let accelerator = Accelerator::Cuda {
            ordinal: 0,
            kv_pool: KvPool::default(),
        };
        let err = accelerator
            .load_settings()
            .err()
            .expect("no CUDA in this build");
        assert!(matches!(&err, LoadError::Device { device, .. } if device == "cuda:0"));
        assert!(format!("{:#}", anyhow::Error::from(err)).contains("cuda"));
    }
}
