//! The web dashboard: a page of plain HTML, CSS and JavaScript, bundled into the binary,
//! that draws a running job from the REST API under `/v1/` (docs/operations.md,
//! "Dashboard"). It owns the files and their paths; it must not compute any figure the
//! API does not serve (the page reads only `/v1/job`, `/v1/operators`, `/v1/checkpoints`
//! and `/v1/exceptions`).
//!
//! The files are served as they are: no build step, no CDN, nothing fetched from
//! anywhere else (docs/decisions/0025-web-dashboard.md).

/// One file of the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    /// The path it is served at (`/` for the page itself).
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its content.
    pub body: &'static str,
}

/// Every file of the dashboard; the page is the first, at `/`.
///
/// ```
/// use weir_runtime::dashboard::ASSETS;
///
/// assert_eq!(ASSETS[0].path, "/");
/// assert!(ASSETS[0].body.contains("<title>weir"));
/// // The page loads every other file from the same server, nothing from elsewhere.
/// for a in &ASSETS[1..] {
///     assert!(ASSETS[0].body.contains(a.path), "{} is not referenced", a.path);
/// }
/// ```
pub const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("dashboard/index.html"),
    },
    Asset {
        path: "/dashboard/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("dashboard/style.css"),
    },
    Asset {
        path: "/dashboard/util.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("dashboard/util.js"),
    },
    Asset {
        path: "/dashboard/graph.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("dashboard/graph.js"),
    },
    Asset {
        path: "/dashboard/charts.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("dashboard/charts.js"),
    },
    Asset {
        path: "/dashboard/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("dashboard/app.js"),
    },
];

/// The dashboard's file served at `path`, if any.
///
/// ```
/// use weir_runtime::dashboard::asset;
///
/// assert_eq!(asset("/dashboard/app.js").unwrap().content_type, "text/javascript; charset=utf-8");
/// assert!(asset("/v1/job").is_none());
/// ```
pub fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    /// Nothing is loaded from another origin: the dashboard works without a network.
    #[test]
    fn the_dashboard_loads_nothing_from_elsewhere() {
        for a in ASSETS {
            for needle in ["http://", "https://", "//cdn", "@import"] {
                let hits: Vec<&str> = a
                    .body
                    .lines()
                    .filter(|l| l.contains(needle) && !l.contains("www.w3.org/2000/svg"))
                    .collect();
                assert!(hits.is_empty(), "{} refers to {needle}: {hits:?}", a.path);
            }
        }
    }

    /// Every path is distinct and every script the page names is served.
    #[test]
    fn the_page_names_exactly_the_served_files() {
        let page = ASSETS[0].body;
        let referenced: Vec<&str> = page
            .split(['"', '\''])
            .filter(|s| s.starts_with("/dashboard/"))
            .collect();
        let served: Vec<&str> = ASSETS[1..].iter().map(|a| a.path).collect();
        let mut r = referenced.clone();
        r.sort();
        let mut s = served.clone();
        s.sort();
        assert_eq!(r, s);
    }
}
