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
/// every password sqlx would read (the user info's, and a `password` in the query, under
/// whatever other name for a password too) as `***`, so where it connects stays
/// readable. It is read with the `url` crate, as sqlx reads it, so the two agree on
/// where each part starts and ends; a URL that crate cannot read (sqlx cannot connect
/// with it either) shows as `***` whole.
///
/// ```
/// use service_kit::secret::SecretUrl;
///
/// let url: SecretUrl = "postgres://orders:s3cret@db:5432/orders".parse().unwrap();
/// assert_eq!(url.to_string(), "postgres://orders:***@db:5432/orders");
/// assert_eq!(url.expose(), "postgres://orders:s3cret@db:5432/orders");
/// let url: SecretUrl = "postgres://orders@db/orders?password=s3cret".parse().unwrap();
/// assert_eq!(url.to_string(), "postgres://orders@db/orders?password=***");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl {
    url: String,
    /// What `Display` shows, made once.
    shown: String,
}

/// What a hidden value shows.
const HIDDEN: &str = "***";

impl SecretUrl {
    /// The URL with its password, for the one place that connects.
    pub fn expose(&self) -> &str {
        &self.url
    }
}

/// `url` with each password as [`HIDDEN`]: one the URL carries can only be in the user
/// info or the query (sqlx reads no other part), and a query key is matched as sqlx
/// matches it, decoded.
fn hide_passwords(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return HIDDEN.to_owned();
    };
    if parsed.cannot_be_a_base() {
        // `user:password@host` with no `//`: not a URL with a host, so hidden whole.
        return HIDDEN.to_owned();
    }
    if parsed.password().is_some() && parsed.set_password(Some(HIDDEN)).is_err() {
        return HIDDEN.to_owned();
    }
    let names_a_password = |key: &str| key.to_ascii_lowercase().contains("password");
    if parsed.query_pairs().any(|(key, _)| names_a_password(&key)) {
        let pairs: Vec<(String, String)> = (parsed.query_pairs())
            .map(|(key, value)| match names_a_password(&key) {
                true => (key.into_owned(), HIDDEN.to_owned()),
                false => (key.into_owned(), value.into_owned()),
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.into()
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
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
        Ok(Self {
            url: value.to_owned(),
            shown: hide_passwords(value),
        })
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
        assert_eq!(shown("u:p@h"), "***");
        assert_eq!(shown(""), "***");
    }

    #[test]
    fn a_password_in_the_query_is_hidden_too() {
        // sqlx reads `password` from the query as it does from the user info.
        assert_eq!(
            shown("postgres://u@h/db?password=s3cret"),
            "postgres://u@h/db?password=***"
        );
        assert_eq!(
            shown("postgres://u:p@h/db?sslmode=disable&password=s3cret&application_name=x"),
            "postgres://u:***@h/db?sslmode=disable&password=***&application_name=x"
        );
        // Encoded names are decoded by sqlx too; every name for a password is hidden.
        for url in [
            "postgres://h/db?pass%77ord=s3cret",
            "postgres://h/db?password=a&password=s3cret",
            "postgres://h/db?sslpassword=s3cret",
            "postgres://h/db?PASSWORD=s3cret",
        ] {
            let url: SecretUrl = url.parse().unwrap();
            let (shown, debug) = (url.to_string(), format!("{url:?}"));
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(!debug.contains("s3cret"), "{debug}");
        }
    }

    #[test]
    fn a_url_that_does_not_parse_shows_nothing_of_itself() {
        // sqlx cannot connect with it either, so nothing is lost by hiding it whole.
        let url: SecretUrl = "postgres://u:s3cret@h:notaport/db".parse().unwrap();
        assert!(!url.to_string().contains("s3cret"), "{url}");
        assert!(!format!("{url:?}").contains("s3cret"), "{url:?}");
        assert_eq!(url.expose(), "postgres://u:s3cret@h:notaport/db");
    }

    proptest::proptest! {
        /// Wherever sqlx would read a password (the user info, or a `password` in the
        /// query), escaped or not, it never shows, in `Display` or `Debug`.
        #[test]
        fn no_password_ever_shows(
            user in "[a-z]{0,8}",
            password in "[ -~]{0,12}",
            host in "[a-z]{1,8}(:[0-9]{1,4})?",
            path in "(/[a-z]{0,10})?",
            before in proptest::collection::vec("[a-z_]{1,8}=[ -~]{0,8}", 0..3),
            after in proptest::collection::vec("[a-z_]{1,8}=[ -~]{0,8}", 0..3),
            in_query in proptest::bool::ANY,
            escaped in proptest::bool::ANY,
        ) {
            const MARK: &str = "Zq9Zq";
            let secret = format!("{password}{MARK}");
            let encode = |text: &str| {
                url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>()
            };
            let written = if escaped { encode(&secret) } else { secret.clone() };
            let query = |pairs: &[String]| {
                pairs.iter().map(|pair| match pair.split_once('=') {
                    Some((key, value)) => format!("{key}={}", encode(value)),
                    None => pair.clone(),
                }).collect::<Vec<_>>()
            };
            let mut pairs = query(&before);
            let userinfo = match in_query {
                true => {
                    pairs.push(format!("password={written}"));
                    format!("{user}@")
                }
                false => format!("{user}:{written}@"),
            };
            pairs.extend(query(&after));
            let query = match pairs.is_empty() {
                true => String::new(),
                false => format!("?{}", pairs.join("&")),
            };
            let url: SecretUrl = format!("postgres://{userinfo}{host}{path}{query}").parse().unwrap();
            // What sqlx reads as a password: it parses with the `url` crate too. Written
            // escaped, the secret is always read; written raw, a `#` or `&` in it may cut
            // it short, and then what follows the cut is no password to sqlx.
            let read = read_by_sqlx(url.expose());
            proptest::prop_assert!(!escaped || read.iter().any(|p| p.contains(MARK)), "{:?}", read);
            if read.iter().any(|p| p.contains(MARK)) {
                let (shown, debug) = (url.to_string(), format!("{url:?}"));
                proptest::prop_assert!(!shown.contains(MARK), "{}", shown);
                proptest::prop_assert!(!debug.contains(MARK), "{}", debug);
            }
        }
    }

    /// Every password sqlx 0.9 takes from a URL (`PgConnectOptions::parse_from_url`),
    /// as written (sqlx decodes the user info's, which leaves the mark as it is).
    fn read_by_sqlx(url: &str) -> Vec<String> {
        let Ok(url) = url::Url::parse(url) else {
            return Vec::new();
        };
        let pairs = url.query_pairs().filter(|(key, _)| key == "password");
        let query = pairs.map(|(_, value)| value.into_owned());
        url.password()
            .map(str::to_owned)
            .into_iter()
            .chain(query)
            .collect()
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
