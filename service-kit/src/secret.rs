//! Settings that must never be printed: `Debug` of a configuration goes to logs and
//! panics, so the types say what may show. With clap, give their arguments
//! `hide_env_values = true` too, or `--help` prints the environment's value.

use std::fmt;
use std::str::FromStr;

/// A secret setting (an API key): `Debug` says only that it is set.
///
/// ```
/// use service_kit::secret::Secret;
///
/// let key: Secret = "sk-123".parse().unwrap();
/// assert_eq!(key.expose(), "sk-123");
/// assert_eq!(format!("{key:?}"), "Secret(***)");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(Self(value.to_owned()))
    }
}

/// A URL that may carry a password (a database's): `Debug` and `Display` show it with
/// the password as `***`, so where it connects stays readable.
///
/// ```
/// use service_kit::secret::SecretUrl;
///
/// let url: SecretUrl = "postgres://orders:s3cret@db:5432/orders".parse().unwrap();
/// assert_eq!(url.to_string(), "postgres://orders:***@db:5432/orders");
/// assert_eq!(url.expose(), "postgres://orders:s3cret@db:5432/orders");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// The URL with its password, for the one place that connects.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // scheme://user:password@host/...: the password is between the first ':' of the
        // user info and its last '@'.
        let url = &self.0;
        let start = url.find("://").map_or(0, |at| at + 3);
        let authority_end = url[start..].find('/').map_or(url.len(), |at| start + at);
        let Some(at) = url[start..authority_end].rfind('@').map(|at| start + at) else {
            return f.write_str(url);
        };
        match url[start..at].find(':').map(|colon| start + colon) {
            Some(colon) => write!(f, "{}:***{}", &url[..colon], &url[at..]),
            None => f.write_str(url),
        }
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

impl FromStr for SecretUrl {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(Self(value.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(url: &str) -> String {
        url.parse::<SecretUrl>().unwrap().to_string()
    }

    #[test]
    fn only_the_password_is_hidden() {
        assert_eq!(shown("postgres://u:p@h/db"), "postgres://u:***@h/db");
        assert_eq!(shown("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(shown("postgres://h:5432/db"), "postgres://h:5432/db");
        assert_eq!(shown("postgres://u:p:q@h"), "postgres://u:***@h");
        assert_eq!(
            shown("postgres://u:p@x@h/db?a=b@c"),
            "postgres://u:***@h/db?a=b@c"
        );
        assert_eq!(shown("u:p@h"), "u:***@h");
        assert_eq!(shown(""), "");
    }

    proptest::proptest! {
        /// Whatever the URL, a password between `user:` and `@host` never shows.
        #[test]
        fn a_password_never_shows(
            user in "[a-z]{1,8}",
            password in "[A-Za-z0-9@:%]{1,12}",
            host in "[a-z]{1,8}(:[0-9]{1,5})?",
            path in "(/[a-z@:?=]{0,10})?",
        ) {
            let url = format!("postgres://{user}:{password}Z9@{host}{path}");
            let secret = format!("{password}Z9");
            let url: SecretUrl = url.parse().unwrap();
            let (shown, debug) = (url.to_string(), format!("{url:?}"));
            proptest::prop_assert!(!shown.contains(&secret), "{}", shown);
            proptest::prop_assert!(!debug.contains(&secret), "{}", debug);
        }
    }
}
