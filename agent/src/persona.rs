//! A persona: who the agent is on a call (its instructions, what it says first, what it
//! says when a turn fails, how its voice sounds), read from a TOML file (`--persona FILE`),
//! so that the same process can be a booking desk or a help line without a rebuild.
//!
//! ```toml
//! instructions = "You take bookings for the Harbour Hotel. …"
//! greeting = "Harbour Hotel, good morning. How can I help?"   # optional
//! fallback = "Sorry, could you say that again?"               # optional
//!
//! [voice]               # optional; each absent setting keeps the voice's own
//! length_scale = 1.05   # above 1 speaks slower
//! noise_scale = 0.6     # how much pitch and energy vary
//! ```
//!
//! Unknown keys are refused, so a misspelt setting is an error rather than silently unused.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use serde::Deserialize;

use crate::AgentConfig;

/// The agent's persona, as a file gives it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Persona {
    /// The agent's instructions: its system prompt.
    pub instructions: String,
    /// What it says as a live call begins (the caller's first audio); none when absent.
    #[serde(default)]
    pub greeting: Option<String>,
    /// What it says when a turn fails; the default phrase when absent.
    #[serde(default)]
    pub fallback: Option<String>,
    #[serde(default)]
    pub voice: VoiceSettings,
}

/// How the agent's voice sounds; each `None` keeps the voice's own setting.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoiceSettings {
    /// Stretches every sound: above 1 speaks slower (Piper's `length_scale`).
    pub length_scale: Option<f32>,
    /// How much pitch and energy vary (Piper's `noise_scale`).
    pub noise_scale: Option<f32>,
}

/// Settings beyond these would make speech a caller cannot follow (or a model that
/// produces noise): a third of the voice's speed or three times it.
const LENGTH_SCALES: std::ops::RangeInclusive<f32> = 0.33..=3.0;
const NOISE_SCALES: std::ops::RangeInclusive<f32> = 0.0..=2.0;

impl Persona {
    /// Reads and checks a persona file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the persona {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("the persona {}", path.display()))
    }

    /// Parses and checks a persona's TOML.
    pub fn parse(text: &str) -> Result<Self> {
        let persona: Persona = toml::from_str(text)?;
        ensure!(
            !persona.instructions.trim().is_empty(),
            "`instructions` is empty: the agent needs its instructions"
        );
        if let Some(scale) = persona.voice.length_scale {
            ensure!(
                LENGTH_SCALES.contains(&scale),
                "voice.length_scale {scale} is outside {LENGTH_SCALES:?}"
            );
        }
        if let Some(scale) = persona.voice.noise_scale {
            ensure!(
                NOISE_SCALES.contains(&scale),
                "voice.noise_scale {scale} is outside {NOISE_SCALES:?}"
            );
        }
        Ok(persona)
    }

    /// The agent's configuration as this persona: `config` with its instructions,
    /// greeting, fallback phrase and voice.
    pub fn apply(&self, config: AgentConfig) -> AgentConfig {
        AgentConfig {
            system_prompt: self.instructions.trim().to_owned(),
            greeting: self.greeting.clone().unwrap_or_default(),
            fallback_phrase: self
                .fallback
                .clone()
                .unwrap_or_else(|| config.fallback_phrase.clone()),
            voice: self.voice,
            ..config
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../demos/personas/booking.toml");

    #[test]
    fn the_example_booking_persona_reads_and_applies() {
        let persona = Persona::parse(EXAMPLE).unwrap();
        let config = persona.apply(AgentConfig::default());
        assert!(config.system_prompt.contains("exactly"), "{config:?}");
        assert!(!config.greeting.is_empty());
        assert_eq!(config.voice, persona.voice);
        // What the persona leaves out keeps its default.
        assert_eq!(
            config.max_reply_tokens,
            AgentConfig::default().max_reply_tokens
        );
    }

    #[test]
    fn absent_settings_keep_the_defaults() {
        let persona = Persona::parse("instructions = \"Be brief.\"").unwrap();
        let config = persona.apply(AgentConfig::default());
        assert_eq!(config.system_prompt, "Be brief.");
        assert_eq!(config.greeting, "");
        assert_eq!(
            config.fallback_phrase,
            AgentConfig::default().fallback_phrase
        );
        assert_eq!(config.voice, VoiceSettings::default());
    }

    #[test]
    fn a_bad_persona_is_refused_with_what_is_wrong() {
        let refused = |text: &str| format!("{:#}", Persona::parse(text).unwrap_err());
        assert!(refused("greeting = \"Hi\"").contains("instructions"));
        assert!(refused("instructions = \"x\"\ngreting = \"Hi\"").contains("greting"));
        assert!(refused("instructions = \" \"").contains("empty"));
        assert!(
            refused("instructions = \"x\"\n[voice]\nlength_scale = 40.0").contains("length_scale")
        );
        assert!(refused("instructions = \"x\"\n[voice]\nspeed = 1.0").contains("speed"));
        assert!(refused("instructions = [").contains("parse error"));
    }
}
