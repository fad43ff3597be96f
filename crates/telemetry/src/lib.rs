//! Logs and traces of the toolgraph binary.
//!
//! Logs go to stderr through `tracing` (filter: `TOOLGRAPH_LOG`, else the verbosity). With the
//! `otlp` feature and an endpoint configured the way the Lumie worker configures it (`OTEL_ENDPOINT`,
//! `OTEL_ENABLED` not false), the spans of the toolgraph crates (`http.request`, `chat.turn`,
//! `llm.call`, `tool.call`) are also exported over OTLP/gRPC in batches, off the request path.
//! Without an endpoint nothing is exported and no exporter is built.

use std::time::Duration;

/// A telemetry set-up failure.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A setting is invalid; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// The exporter could not be built.
    #[error("cannot start the OTLP exporter: {0}")]
    Exporter(String),
    /// A global subscriber was already installed.
    #[error("logging was already set up")]
    AlreadyInstalled,
}

/// Where spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpOptions {
    /// The collector's OTLP/gRPC endpoint, e.g. `http://otel-collector:4317`.
    pub endpoint: String,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// Limit of one export call.
    pub timeout: Duration,
}

impl OtlpOptions {
    /// The Lumie worker's settings: `OTEL_ENDPOINT` (unset or empty: no export), `OTEL_ENABLED`
    /// (default true; `false`/`0`/`no`/`off` turn export off), and `OTEL_SERVICE_NAME`
    /// (default `toolgraph`).
    ///
    /// # Errors
    /// An endpoint that is not an http(s) URL, or an `OTEL_ENABLED` that is not a boolean.
    pub fn from_env() -> Result<Option<Self>, TelemetryError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any variable source (tests).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, TelemetryError> {
        let enabled = match var("OTEL_ENABLED").as_deref().map(str::trim).map(str::to_ascii_lowercase) {
            None => true,
            Some(v) => match v.as_str() {
                "" | "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                other => {
                    return Err(TelemetryError::Invalid(format!("OTEL_ENABLED: '{other}' is not true or false")));
                }
            },
        };
        let endpoint = var("OTEL_ENDPOINT").map(|e| e.trim().to_owned()).filter(|e| !e.is_empty());
        let Some(endpoint) = endpoint.filter(|_| enabled) else { return Ok(None) };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) || endpoint.len() <= "https://".len()
        {
            return Err(TelemetryError::Invalid(format!(
                "OTEL_ENDPOINT: '{endpoint}' is not an http(s) URL such as http://otel-collector:4317"
            )));
        }
        let service_name = var("OTEL_SERVICE_NAME").filter(|s| !s.trim().is_empty()).unwrap_or("toolgraph".into());
        Ok(Some(Self { endpoint, service_name, timeout: Duration::from_secs(10) }))
    }
}

/// What to set up.
#[derive(Debug, Clone)]
pub struct TelemetryOptions {
    /// `tracing` filter of the stderr log (`EnvFilter` syntax).
    pub log_filter: String,
    /// Colour codes in the log (for a person at a terminal).
    pub ansi: bool,
    /// Span export; `None`: none.
    pub otlp: Option<OtlpOptions>,
}

/// The crates whose spans are exported.
pub const TRACED_CRATES: [&str; 6] =
    ["toolgraph", "toolgraph_server", "toolgraph_graph", "toolgraph_llm", "toolgraph_tools", "toolgraph_rag"];

/// Keeps the exporter alive; [`shutdown`](Self::shutdown) flushes the spans still queued.
#[must_use = "dropping the guard without shutdown loses the spans still queued"]
pub struct TelemetryGuard {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are being exported.
    pub fn exporting(&self) -> bool {
        #[cfg(feature = "otlp")]
        return self.provider.is_some();
        #[cfg(not(feature = "otlp"))]
        false
    }

    /// Exports what is queued and stops the exporter. Blocks (up to the export timeout):
    /// call it outside async code, or on a blocking thread.
    pub fn shutdown(self) {
        #[cfg(feature = "otlp")]
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown()
        {
            eprintln!("warning: the OTLP exporter did not shut down cleanly: {e}");
        }
    }
}

/// Installs the global subscriber: the stderr log, plus the OTLP layer when `options.otlp`
/// is set and this build has the `otlp` feature (without it, a warning says the endpoint is
/// ignored). With OTLP, call this inside the Tokio runtime: the batch exporter runs on it.
///
/// # Errors
/// See [`TelemetryError`].
pub fn install(options: TelemetryOptions) -> Result<TelemetryGuard, TelemetryError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let filter = EnvFilter::try_new(&options.log_filter)
        .map_err(|e| TelemetryError::Invalid(format!("log filter '{}': {e}", options.log_filter)))?;
    let log = tracing_subscriber::fmt::layer().with_ansi(options.ansi).with_writer(std::io::stderr).with_filter(filter);
    let registry = tracing_subscriber::registry().with(log);
    #[cfg(feature = "otlp")]
    {
        let (layer, provider) = match &options.otlp {
            Some(o) => {
                let (layer, provider) = otlp::layer(o)?;
                (Some(layer), Some(provider))
            }
            None => (None, None),
        };
        registry.with(layer).try_init().map_err(|_| TelemetryError::AlreadyInstalled)?;
        Ok(TelemetryGuard { provider })
    }
    #[cfg(not(feature = "otlp"))]
    {
        registry.try_init().map_err(|_| TelemetryError::AlreadyInstalled)?;
        if let Some(o) = &options.otlp {
            tracing::warn!(
                endpoint = %o.endpoint,
                "OTEL_ENDPOINT is set but this build cannot export spans; build with `--features otel`"
            );
        }
        Ok(TelemetryGuard {})
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    //! The OTLP/gRPC span exporter as a `tracing` layer.

    use super::{OtlpOptions, TRACED_CRATES, TelemetryError};
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
    use tracing::Level;
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::registry::LookupSpan;

    /// The layer exporting the toolgraph crates' spans, and the provider to shut down.
    pub fn layer<S>(o: &OtlpOptions) -> Result<(impl Layer<S>, SdkTracerProvider), TelemetryError>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(o.endpoint.clone())
            .with_timeout(o.timeout)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        // The batch processor runs on the Tokio runtime: the SDK's default one exports from
        // a thread of its own, where tonic finds no reactor and drops every batch.
        let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(Resource::builder().with_service_name(o.service_name.clone()).build())
            .build();
        let tracer = provider.tracer("toolgraph");
        let targets = TRACED_CRATES.iter().fold(Targets::new(), |t, c| t.with_target(*c, Level::INFO));
        let layer = tracing_opentelemetry::layer().with_tracer(tracer).with_filter(targets);
        Ok((layer, provider))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn the_seed_settings_decide_whether_spans_are_exported() {
        assert_eq!(OtlpOptions::from_vars(vars(&[])).unwrap(), None, "no endpoint, no export");
        assert_eq!(OtlpOptions::from_vars(vars(&[("OTEL_ENDPOINT", " ")])).unwrap(), None);
        let on = OtlpOptions::from_vars(vars(&[("OTEL_ENDPOINT", "http://collector:4317")])).unwrap().unwrap();
        assert_eq!((on.endpoint.as_str(), on.service_name.as_str()), ("http://collector:4317", "toolgraph"));
        let off = vars(&[("OTEL_ENDPOINT", "http://collector:4317"), ("OTEL_ENABLED", "false")]);
        assert_eq!(OtlpOptions::from_vars(off).unwrap(), None, "OTEL_ENABLED=false wins");
        let named = vars(&[("OTEL_ENDPOINT", "https://c:4317"), ("OTEL_ENABLED", "1"), ("OTEL_SERVICE_NAME", "tg")]);
        assert_eq!(OtlpOptions::from_vars(named).unwrap().unwrap().service_name, "tg");
    }

    #[test]
    fn bad_settings_are_named() {
        let err = OtlpOptions::from_vars(vars(&[("OTEL_ENDPOINT", "collector:4317")])).unwrap_err().to_string();
        assert!(err.contains("OTEL_ENDPOINT") && err.contains("collector:4317"), "{err}");
        let err = OtlpOptions::from_vars(vars(&[("OTEL_ENABLED", "maybe")])).unwrap_err().to_string();
        assert!(err.contains("OTEL_ENABLED") && err.contains("maybe"), "{err}");
        let err = install(TelemetryOptions { log_filter: "=[".into(), ansi: false, otlp: None }).err().unwrap();
        assert!(err.to_string().contains("log filter"), "{err}");
    }
}
