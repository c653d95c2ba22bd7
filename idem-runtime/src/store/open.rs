//! Opening a store from a URL: the scheme picks the backend, the rest is the backend's own
//! options (as sqlx's `Any` driver does). Backends not built in (a feature off) are named in the
//! error, with the feature that adds them.

use std::sync::Arc;

use super::admin::AdminStore;
use crate::error::{OpenError, redact_url};

/// The schemes [`open`] accepts in this build, and the features that add the others.
fn schemes() -> String {
    let mut on = vec!["memory://"];
    let mut off = Vec::new();
    let mut backend = |enabled: bool, scheme: &'static str, feature: &'static str| {
        if enabled {
            on.push(scheme);
        } else {
            off.push(format!("`{feature}` for {scheme}"));
        }
    };
    backend(cfg!(feature = "sqlite"), "sqlite://PATH", "sqlite");
    backend(cfg!(feature = "postgres"), "postgres://…", "postgres");
    backend(
        cfg!(feature = "redis"),
        "redis://…, rediss://…, redis+cluster://…",
        "redis",
    );
    let mut text = on.join(", ");
    if !off.is_empty() {
        text.push_str(&format!(" (enable the feature {})", off.join(", ")));
    }
    text
}

/// Opens the store `url` names, with its admin side (the URL forms are listed at
/// [`IdemBuilder::open`](crate::IdemBuilder::open)).
pub(crate) async fn open(url: &str) -> Result<Arc<dyn AdminStore>, OpenError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(OpenError::InvalidUrl {
            url: redact_url(url),
            reason: "expected `scheme://…`, e.g. `sqlite://idem.db` or `memory://`".into(),
        });
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" if rest.is_empty() => Ok(Arc::new(super::memory::MemoryStore::new())),
        "memory" => Err(OpenError::InvalidUrl {
            url: redact_url(url),
            reason: "`memory://` takes nothing after the scheme".into(),
        }),
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            use super::sqlite::{SqliteOptions, SqliteStore};
            let options =
                SqliteOptions::from_url_rest(rest).map_err(|reason| OpenError::InvalidUrl {
                    url: redact_url(url),
                    reason,
                })?;
            let store = tokio::task::spawn_blocking(move || SqliteStore::open(options))
                .await
                .map_err(|_| {
                    crate::error::StoreError::new(
                        "sqlite",
                        crate::error::StoreErrorKind::Unavailable,
                        "opening the file panicked",
                    )
                })??;
            Ok(Arc::new(store))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            use super::postgres::{PostgresOptions, PostgresStore};
            let options =
                PostgresOptions::from_url(url).map_err(|reason| OpenError::InvalidUrl {
                    url: redact_url(url),
                    reason,
                })?;
            Ok(Arc::new(PostgresStore::open(options).await?))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => {
            use super::redis::{RedisOptions, RedisStore};
            let options = RedisOptions::from_url(url).map_err(|reason| OpenError::InvalidUrl {
                url: redact_url(url),
                reason,
            })?;
            Ok(Arc::new(RedisStore::open(options).await?))
        }
        other => Err(OpenError::UnsupportedScheme {
            scheme: other.to_owned(),
            available: schemes(),
        }),
    }
}
