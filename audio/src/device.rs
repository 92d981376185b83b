//! Sound cards through cpal (ALSA on Linux, with PulseAudio or PipeWire behind it): the
//! microphone as mono pieces at the pipeline's 16 kHz, and a speaker that asks for what to
//! play. Streams run until dropped.

use anyhow::{anyhow, bail, Context, Result};
use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use cpal::{BufferSize, SampleFormat, StreamConfig};

use crate::{StreamResampler, SPEECH_RATE};

/// How much audio a callback carries, when the device lets us choose: 20 ms.
const PERIOD_S: f64 = 0.02;

/// An open input or output stream; it stops when dropped.
pub struct DeviceStream {
    _stream: cpal::Stream,
    /// The device's name.
    pub name: String,
    /// The device's own sample rate.
    pub rate: u32,
}

/// Reports a stream's errors on stderr, a repeated one only now and then (ALSA's PulseAudio
/// plugin reports a burst of `snd_pcm_avail_delay` I/O errors while a stream starts).
fn report_errors(what: &'static str) -> impl FnMut(cpal::Error) + Send + 'static {
    let mut last = String::new();
    let mut repeats = 0u64;
    move |error| {
        let message = error.to_string();
        if message == last {
            repeats += 1;
            if repeats.is_power_of_two() {
                tracing::warn!("{what}: {message} (again, {repeats} times)");
            }
        } else {
            tracing::warn!("{what}: {message}");
            last = message;
            repeats = 0;
        }
    }
}

/// The names of the input and output devices the system offers.
pub fn device_names() -> Result<(Vec<String>, Vec<String>)> {
    let host = cpal::default_host();
    let names = |devices: Vec<cpal::Device>| devices.iter().map(|d| d.to_string()).collect();
    Ok((
        names(host.input_devices().context("listing inputs")?.collect()),
        names(host.output_devices().context("listing outputs")?.collect()),
    ))
}

fn pick(name: Option<&str>, input: bool) -> Result<cpal::Device> {
    let host = cpal::default_host();
    let kind = if input { "input" } else { "output" };
    match name {
        None => if input {
            host.default_input_device()
        } else {
            host.default_output_device()
        }
        .ok_or_else(|| anyhow!("this system has no default {kind} device")),
        Some(name) => {
            let mut devices: Vec<cpal::Device> = if input {
                host.input_devices()?.collect()
            } else {
                host.output_devices()?.collect()
            };
            let at = devices.iter().position(|d| d.to_string() == name);
            match at {
                Some(at) => Ok(devices.swap_remove(at)),
                None => bail!("no {kind} device is called {name:?} (see --list-devices)"),
            }
        }
    }
}

/// The device's default format, asking for 20 ms callbacks.
fn config(device: &cpal::Device, input: bool) -> Result<(StreamConfig, SampleFormat)> {
    let supported = if input {
        device.default_input_config()
    } else {
        device.default_output_config()
    }
    .with_context(|| format!("the format of {device}"))?;
    let mut config = supported.config();
    config.buffer_size = BufferSize::Fixed((config.sample_rate as f64 * PERIOD_S) as u32);
    Ok((config, supported.sample_format()))
}

/// Opens the microphone (`name`, or the default input) and hands `deliver` its audio as it
/// arrives: mono, resampled to 16 kHz.
pub fn open_microphone(
    name: Option<&str>,
    mut deliver: impl FnMut(Vec<f32>) + Send + 'static,
) -> Result<DeviceStream> {
    let device = pick(name, true)?;
    let (config, format) = config(&device, true)?;
    let channels = config.channels.max(1) as usize;
    let rate = config.sample_rate;
    let mut resampler = StreamResampler::new(rate, SPEECH_RATE);
    let mut on_samples = move |mono: Vec<f32>| {
        let samples = resampler.push(&mono);
        if !samples.is_empty() {
            deliver(samples);
        }
    };
    let downmix = move |frames: &mut dyn Iterator<Item = f32>| -> Vec<f32> {
        let all: Vec<f32> = frames.collect();
        all.chunks(channels)
            .map(|frame| frame.iter().sum::<f32>() / frame.len() as f32)
            .collect()
    };
    let error = report_errors("microphone");
    let stream = match format {
        SampleFormat::F32 => device.build_input_stream::<f32, _, _>(
            config,
            move |data, _| on_samples(downmix(&mut data.iter().copied())),
            error,
            None,
        ),
        SampleFormat::I16 => device.build_input_stream::<i16, _, _>(
            config,
            move |data, _| on_samples(downmix(&mut data.iter().map(|s| *s as f32 / 32768.0))),
            error,
            None,
        ),
        other => bail!("{device} delivers {other} samples; f32 and i16 are supported"),
    }
    .with_context(|| format!("opening {device} for input"))?;
    stream.play().context("starting the microphone")?;
    Ok(DeviceStream {
        _stream: stream,
        name: device.to_string(),
        rate,
    })
}

/// Opens the speaker (`name`, or the default output) at its own rate; `filler` is given
/// that rate and returns what is asked for mono samples as the device needs them.
pub fn open_speaker<F>(name: Option<&str>, filler: impl FnOnce(u32) -> F) -> Result<DeviceStream>
where
    F: FnMut(&mut [f32]) + Send + 'static,
{
    let device = pick(name, false)?;
    let (config, format) = config(&device, false)?;
    let channels = config.channels.max(1) as usize;
    let rate = config.sample_rate;
    let mut fill = filler(rate);
    let mut mono = Vec::new();
    let error = report_errors("speaker");
    let stream = match format {
        SampleFormat::F32 => device.build_output_stream::<f32, _, _>(
            config,
            move |data, _| {
                mono.resize(data.len() / channels, 0.0);
                fill(&mut mono);
                for (frame, sample) in data.chunks_mut(channels).zip(&mono) {
                    frame.fill(*sample);
                }
            },
            error,
            None,
        ),
        SampleFormat::I16 => device.build_output_stream::<i16, _, _>(
            config,
            move |data, _| {
                mono.resize(data.len() / channels, 0.0);
                fill(&mut mono);
                for (frame, sample) in data.chunks_mut(channels).zip(&mono) {
                    frame.fill((sample.clamp(-1.0, 1.0) * 32767.0) as i16);
                }
            },
            error,
            None,
        ),
        other => bail!("{device} takes {other} samples; f32 and i16 are supported"),
    }
    .with_context(|| format!("opening {device} for output"))?;
    stream.play().context("starting the speaker")?;
    Ok(DeviceStream {
        _stream: stream,
        name: device.to_string(),
        rate,
    })
}
