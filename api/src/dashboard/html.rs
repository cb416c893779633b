//! The dashboard's pages, built as strings. Every piece of text that comes
//! from a user or the store goes through [`esc`]; nothing else is
//! interpolated into markup.

use hindsight_schemas::Timestamp;
use std::fmt::Write;

/// Escapes text for HTML content and double-quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `2025-09-01 12:00 UTC`.
pub fn when(t: Timestamp) -> String {
    chrono::DateTime::from_timestamp_millis(t.0).map_or_else(
        || "-".into(),
        |d| d.format("%Y-%m-%d %H:%M UTC").to_string(),
    )
}

/// Who is signed in, for the header.
pub struct Nav<'a> {
    pub email: &'a str,
    pub organization: &'a str,
    pub csrf: &'a str,
}

/// A whole page: `body` is markup built by this module.
pub fn page(title: &str, nav: Option<&Nav>, body: &str) -> String {
    let mut header =
        String::from(r#"<header class="top"><a class="brand" href="/dashboard">Hindsight</a>"#);
    if let Some(nav) = nav {
        let _ = write!(
            header,
            r#"<nav aria-label="Dashboard"><a href="/dashboard">Keys</a><a href="/dashboard/usage">Usage</a><a href="/dashboard/markets">Explore</a>
<span class="muted">{} · {}</span>
<form class="inline" method="post" action="/dashboard/sign-out">{}<button class="secondary" type="submit">Sign out</button></form></nav>"#,
            esc(nav.email),
            esc(nav.organization),
            csrf_field(nav.csrf)
        );
    }
    header.push_str("</header>");
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>{} · Hindsight</title>
<link rel="stylesheet" href="/dashboard/assets/app.css">
<script src="/dashboard/assets/app.js" defer></script>
</head><body>{header}<main id="main">{body}</main></body></html>"#,
        esc(title)
    )
}

pub fn csrf_field(csrf: &str) -> String {
    format!(r#"<input type="hidden" name="csrf" value="{}">"#, esc(csrf))
}

fn message(error: Option<&str>) -> String {
    error.map_or_else(String::new, |e| {
        format!(r#"<p class="card error" role="alert">{}</p>"#, esc(e))
    })
}

pub fn sign_in(csrf: &str, email: &str, error: Option<&str>) -> String {
    let body = format!(
        r#"<section class="card narrow"><h1>Sign in</h1>{}
<form method="post" action="/dashboard/sign-in">{}
<label for="email">Email</label><input id="email" name="email" type="email" autocomplete="username" required value="{}">
<label for="password">Password</label><input id="password" name="password" type="password" autocomplete="current-password" required>
<p><button type="submit">Sign in</button></p></form>
<p class="muted">New here? Your operator or your organization's owner sends you a sign-in link.</p></section>"#,
        message(error),
        csrf_field(csrf),
        esc(email)
    );
    page("Sign in", None, &body)
}

pub fn set_password(csrf: &str, token: &str, error: Option<&str>) -> String {
    let body = format!(
        r#"<section class="card narrow"><h1>Set your password</h1>{}
<p class="muted">This link works once. Choose a password of at least {} characters.</p>
<form method="post" action="/dashboard/link">{}<input type="hidden" name="token" value="{}">
<label for="password">New password</label><input id="password" name="password" type="password" autocomplete="new-password" required minlength="{}">
<label for="again">Repeat the password</label><input id="again" name="again" type="password" autocomplete="new-password" required>
<p><button type="submit">Set password and sign in</button></p></form></section>"#,
        message(error),
        super::accounts::MIN_PASSWORD_CHARS,
        csrf_field(csrf),
        esc(token),
        super::accounts::MIN_PASSWORD_CHARS,
    );
    page("Set your password", None, &body)
}

/// An error page: a status's title and what to do.
pub fn error(title: &str, detail: &str) -> String {
    let body = format!(
        r#"<section class="card narrow error-page"><h1>{}</h1><p role="alert" id="detail">{}</p><p><a href="/dashboard">Back to the dashboard</a></p></section>"#,
        esc(title),
        esc(detail)
    );
    page(title, None, &body)
}

/// One row of the keys table.
pub struct KeyRow {
    pub key_id: String,
    pub name: String,
    pub prefix: String,
    pub created_at: Timestamp,
    pub last_used: Option<Timestamp>,
    pub requests_24h: u64,
    pub revoked_at: Option<Timestamp>,
}

/// A secret just created, shown once.
pub struct NewSecret<'a> {
    pub name: &'a str,
    pub secret: &'a str,
}

/// What the last invitation did: the link made, or why none was.
pub type Invited<'a> = Option<Result<(&'a str, &'a str), &'a str>>;

/// The owners' form inviting a member, with the last invitation's outcome.
pub fn members(csrf: &str, invited: Invited) -> String {
    let outcome = match invited {
        None => String::new(),
        Some(Ok((email, link))) => format!(
            r#"<div class="notice" aria-live="polite"><p>Send this one-time sign-in link to {} (it works once, for 24 hours):</p>
<code class="secret" id="invite-link">{}</code><button type="button" data-copy="invite-link">Copy link</button></div>"#,
            esc(email),
            esc(link)
        ),
        Some(Err(why)) => format!(r#"<p class="error" role="alert">{}</p>"#, esc(why)),
    };
    format!(
        r#"<section class="card"><h2>Invite a member</h2>{outcome}
<form class="row" method="post" action="/dashboard/members">{}<div class="grow"><label for="member-email">Email of the new member</label>
<input id="member-email" name="email" type="email" required></div><div><button type="submit">Invite</button></div></form></section>"#,
        csrf_field(csrf)
    )
}

pub fn keys(
    nav: &Nav,
    plan: &str,
    rows: &[KeyRow],
    shown: Option<NewSecret>,
    members: Option<String>,
) -> String {
    let mut body = String::new();
    if let Some(new) = shown {
        let _ = write!(
            body,
            r#"<section class="card notice" aria-live="polite"><h2>Key “{}” created</h2>
<p>Copy it now: it is shown only once, and Hindsight keeps only its hash.</p>
<code class="secret" id="new-key">{}</code>
<button type="button" data-copy="new-key">Copy key</button></section>"#,
            esc(new.name),
            esc(new.secret)
        );
    }
    let _ = write!(
        body,
        r#"<section class="card"><h1>API keys</h1><p class="muted">Organization plan: <strong>{}</strong>. Send a key in the <code>X-API-Key</code> header.</p>
<form class="row" method="post" action="/dashboard/keys">{}<div class="grow"><label for="key-name">Name of a new key</label>
<input id="key-name" name="name" type="text" required maxlength="100" placeholder="e.g. research notebook"></div>
<div><button type="submit">Create key</button></div></form></section>"#,
        esc(plan),
        csrf_field(nav.csrf)
    );
    body.push_str(
        r#"<section class="card"><h2>Your organization's keys</h2><table><caption class="sr-only">API keys</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Key</th><th scope="col" class="opt">Created</th><th scope="col">Last used</th><th scope="col" class="num">Requests (24 h)</th><th scope="col">State</th><th scope="col"><span class="sr-only">Actions</span></th></tr></thead><tbody>"#,
    );
    if rows.is_empty() {
        body.push_str(r#"<tr><td colspan="7" class="muted">No keys yet.</td></tr>"#);
    }
    for row in rows {
        let state = match row.revoked_at {
            Some(t) => format!(
                r#"<span class="badge revoked" title="{}">revoked</span>"#,
                esc(&when(t))
            ),
            None => r#"<span class="badge active">active</span>"#.to_string(),
        };
        let actions = if row.revoked_at.is_some() {
            String::new()
        } else {
            let id = esc(&row.key_id);
            let name = esc(&row.name);
            format!(
                r#"<form class="inline" method="post" action="/dashboard/keys/{id}/rotate">{csrf}<button class="secondary" type="submit" aria-label="Rotate {name}">Rotate</button></form>
<form class="inline" method="post" action="/dashboard/keys/{id}/revoke">{csrf}<button class="danger" type="submit" aria-label="Revoke {name}">Revoke</button></form>"#,
                csrf = csrf_field(nav.csrf)
            )
        };
        let _ = write!(
            body,
            r#"<tr data-key-id="{}"><td>{}</td><td><code>{}…</code></td><td class="opt">{}</td><td>{}</td><td class="num">{}</td><td>{state}</td><td>{actions}</td></tr>"#,
            esc(&row.key_id),
            esc(&row.name),
            esc(&row.prefix),
            esc(&when(row.created_at)),
            row.last_used
                .map_or_else(|| "never".into(), |t| esc(&when(t))),
            row.requests_24h,
        );
    }
    body.push_str("</tbody></table></section>");
    body.push_str(&members.unwrap_or_default());
    page("API keys", Some(nav), &body)
}
