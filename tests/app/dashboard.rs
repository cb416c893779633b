//! The dashboard over HTTP, as a browser without JavaScript would use it:
//! sign-in links, sessions, CSRF, throttling, keys, and what is stored and
//! logged. The accounts are created with the real `hindsight accounts` CLI
//! on the app's data directory. (Real headless Chromium: `dashboard_browser`.)

use crate::helpers::*;
use hindsight_schemas::Timestamp;
use reqwest::header::{HeaderMap, COOKIE, LOCATION, SET_COOKIE};
use reqwest::redirect::Policy;
use std::path::Path;
use std::time::Duration;

/// A browser: one cookie jar (the session cookie), redirects not followed.
pub struct Browser {
    client: reqwest::Client,
    base: String,
    pub cookie: Option<String>,
}

pub struct Page {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Page {
    pub fn location(&self) -> Option<&str> {
        self.headers.get(LOCATION).and_then(|v| v.to_str().ok())
    }

    /// The CSRF token of the page's first form.
    pub fn csrf(&self) -> String {
        between(&self.body, r#"name="csrf" value=""#, "\"")
            .unwrap_or_else(|| panic!("no CSRF field in {}", self.body))
    }
}

pub fn between(text: &str, start: &str, end: &str) -> Option<String> {
    let from = text.find(start)? + start.len();
    let len = text[from..].find(end)?;
    Some(text[from..from + len].to_string())
}

fn form_encode(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Browser {
    pub fn new(base: &str) -> Self {
        Browser {
            client: reqwest::Client::builder()
                .redirect(Policy::none())
                .build()
                .unwrap(),
            base: base.to_string(),
            cookie: None,
        }
    }

    async fn send(&mut self, request: reqwest::RequestBuilder) -> Page {
        let request = match &self.cookie {
            Some(c) => request.header(COOKIE, format!("hs_session={c}")),
            None => request,
        };
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        for set in headers.get_all(SET_COOKIE) {
            let set = set.to_str().unwrap();
            if let Some(value) = between(set, "hs_session=", ";") {
                self.cookie = (!value.is_empty()).then_some(value);
            }
        }
        let body = response.text().await.unwrap();
        Page {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&mut self, path: &str) -> Page {
        let request = self
            .client
            .get(format!("{}{path}", self.base))
            .header("accept", "text/html");
        self.send(request).await
    }

    pub async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_encode(fields));
        self.send(request).await
    }

    /// Follows a sign-in link and sets `password`; the answer.
    pub async fn set_password(&mut self, link: &str, password: &str) -> Page {
        let token = link.rsplit('/').next().unwrap().to_string();
        let page = self.get(&format!("/dashboard/link/{token}")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let csrf = page.csrf();
        self.post(
            "/dashboard/link",
            &[
                ("csrf", &csrf),
                ("token", &token),
                ("password", password),
                ("again", password),
            ],
        )
        .await
    }

    pub async fn sign_in(&mut self, email: &str, password: &str) -> Page {
        let page = self.get("/dashboard/sign-in").await;
        let csrf = page.csrf();
        self.post(
            "/dashboard/sign-in",
            &[("csrf", &csrf), ("email", email), ("password", password)],
        )
        .await
    }
}

/// `hindsight accounts create` on a data directory: the printed link.
pub fn create_account(data_dir: &Path, org: &str, email: &str, plan: &str, base: &str) -> String {
    let out = hindsight()
        .args([
            "accounts", "create", "--org", org, "--email", email, "--plan", plan,
        ])
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--public-url", base])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let link = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(
        link.starts_with(&format!("{base}/dashboard/link/")),
        "not a sign-in link on {base}: {link}"
    );
    link
}

const PASSWORD: &str = "correct horse battery staple";

/// A signed-in browser of a new organization on `plan`.
async fn signed_in(app: &TestApp, org: &str, plan: &str) -> Browser {
    let email = format!("owner@{org}.example");
    let link = create_account(&app.data_dir, org, &email, plan, &app.api);
    let mut browser = Browser::new(&app.api);
    let page = browser.set_password(&link, PASSWORD).await;
    assert_eq!(page.status, 303, "{}", page.body);
    browser
}

#[tokio::test]
async fn a_browser_at_the_root_is_sent_to_the_dashboard_and_a_client_gets_the_api_404() {
    let app = spawn_app("dash-root").await;
    let mut browser = Browser::new(&app.api);
    let page = browser.get("/").await;
    assert_eq!((page.status, page.location()), (303, Some("/dashboard")));
    let page = browser.get("/dashboard").await;
    assert_eq!(
        (page.status, page.location()),
        (303, Some("/dashboard/sign-in"))
    );
    let page = browser.get("/dashboard/sign-in").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(r#"<label for="email">Email</label>"#));
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    for asset in ["/dashboard/assets/app.css", "/dashboard/assets/app.js"] {
        let page = browser.get(asset).await;
        assert_eq!(page.status, 200, "{asset}");
        assert!(page.body.len() > 200, "{asset}");
    }
    let (status, body) = get(&app, "/").await;
    assert_eq!(status, 404);
    assert_eq!(body["detail"], "Not Found");
    // Behind a TLS proxy the cookie is Secure; over plain http it is not.
    for (proto, secure) in [("https", true), ("http", false)] {
        let answer = client()
            .get(app.api_url("/dashboard/sign-in"))
            .header("x-forwarded-proto", proto)
            .send()
            .await
            .unwrap();
        let set = answer.headers()[SET_COOKIE].to_str().unwrap().to_string();
        assert_eq!(set.contains("; Secure"), secure, "{proto}: {set}");
    }
}

#[tokio::test]
async fn a_sign_in_link_sets_a_password_once_and_the_planted_cookie_is_never_a_session() {
    let app = spawn_app("dash-fixation").await;
    let email = "owner@fix.example";
    let link = create_account(&app.data_dir, "fix", email, "pro", &app.api);
    let mut browser = Browser::new(&app.api);
    // An attacker's cookie value, planted before sign-in.
    let planted = "ab".repeat(32);
    browser.cookie = Some(planted.clone());
    let page = browser.set_password(&link, PASSWORD).await;
    assert_eq!(
        (page.status, page.location()),
        (303, Some("/dashboard")),
        "{}",
        page.body
    );
    let session = browser.cookie.clone().unwrap();
    assert_ne!(
        session, planted,
        "the session kept the planted cookie value"
    );
    let set = page.headers[SET_COOKIE].to_str().unwrap();
    for attribute in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(!set.contains("Secure"), "plain http: {set}");
    let page = browser.get("/dashboard").await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(email) && page.body.contains("API keys"));

    // The planted value is not signed in.
    let mut attacker = Browser::new(&app.api);
    attacker.cookie = Some(planted);
    let page = attacker.get("/dashboard").await;
    assert_eq!(page.location(), Some("/dashboard/sign-in"));

    // The link worked once.
    let page = Browser::new(&app.api)
        .set_password(&link, "another password!")
        .await;
    assert_eq!(page.status, 410, "{}", page.body);

    // Signing in again rotates the session: the earlier one is over.
    let page = browser.sign_in(email, PASSWORD).await;
    assert_eq!(page.status, 303, "{}", page.body);
    let rotated = browser.cookie.clone().unwrap();
    assert_ne!(rotated, session);
    let mut old = Browser::new(&app.api);
    old.cookie = Some(session);
    assert_eq!(
        old.get("/dashboard").await.location(),
        Some("/dashboard/sign-in")
    );

    // Signing out ends the session.
    let csrf = browser.get("/dashboard").await.csrf();
    let page = browser
        .post("/dashboard/sign-out", &[("csrf", &csrf)])
        .await;
    assert_eq!(page.location(), Some("/dashboard/sign-in"));
    let mut signed_out = Browser::new(&app.api);
    signed_out.cookie = Some(rotated);
    assert_eq!(
        signed_out.get("/dashboard").await.location(),
        Some("/dashboard/sign-in")
    );
    // A wrong password does not sign in.
    let page = browser.sign_in(email, "not the password").await;
    assert_eq!(page.status, 401);
    assert!(page.body.contains("wrong email or password"));
}

#[tokio::test]
async fn forms_posted_without_or_with_a_wrong_csrf_token_are_refused_403() {
    let app = spawn_app("dash-csrf").await;
    let mut browser = signed_in(&app, "csrf", "pro").await;
    let csrf = browser.get("/dashboard").await.csrf();
    // Another browser's token, well formed, belongs to another cookie.
    let mut other = Browser::new(&app.api);
    let foreign = other.get("/dashboard/sign-in").await.csrf();
    assert_ne!(foreign, csrf);
    let zeros = "0".repeat(32);
    for bad in [
        vec![("name", "forged")],
        vec![("csrf", zeros.as_str()), ("name", "forged")],
        vec![("csrf", foreign.as_str()), ("name", "forged")],
    ] {
        let page = browser.post("/dashboard/keys", &bad).await;
        assert_eq!(page.status, 403, "{bad:?}: {}", page.body);
        assert!(page.body.contains("security token"), "{}", page.body);
    }
    // A cross-site form carries no cookie at all (SameSite=Lax) and fails too.
    let page = other
        .post("/dashboard/keys", &[("csrf", &csrf), ("name", "forged")])
        .await;
    assert_eq!(page.status, 403);
    let page = browser.post("/dashboard/sign-out", &[]).await;
    assert_eq!(page.status, 403);
    let page = browser.get("/dashboard").await;
    assert!(!page.body.contains("forged"), "a forged form created a key");

    // With the token: created, and the name is escaped.
    let page = browser
        .post(
            "/dashboard/keys",
            &[("csrf", &csrf), ("name", "<script>alert(1)</script>")],
        )
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!page.body.contains("<script>alert(1)"));
    let key = between(&page.body, r#"<code class="secret" id="new-key">"#, "<").unwrap();
    assert!(key.starts_with("hsk_"), "{key}");
    // The key works on /v1, and revoking it with a wrong token is refused.
    assert_eq!(status_of(&app, "/v1/health", &key).await, 200);
    let key_id = between(&page.body, r#"<tr data-key-id=""#, "\"").unwrap();
    let page = browser
        .post(
            &format!("/dashboard/keys/{key_id}/revoke"),
            &[("csrf", &foreign)],
        )
        .await;
    assert_eq!(page.status, 403);
    assert_eq!(status_of(&app, "/v1/health", &key).await, 200);
}

#[tokio::test]
async fn sign_in_is_throttled_per_account_and_per_address() {
    let app = spawn_app("dash-throttle").await;
    let email = "owner@throttle.example";
    let link = create_account(&app.data_dir, "throttle", email, "pro", &app.api);
    let mut browser = Browser::new(&app.api);
    browser.set_password(&link, PASSWORD).await;
    for attempt in 0..5 {
        let page = browser.sign_in(email, "wrong password").await;
        assert_eq!(page.status, 401, "attempt {attempt}");
    }
    // The sixth attempt is refused, even with the right password.
    let page = browser.sign_in(email, PASSWORD).await;
    assert_eq!(page.status, 429, "{}", page.body);
    assert!(
        page.body
            .contains("too many sign-in attempts for this account (5 per minute)"),
        "{}",
        page.body
    );
    assert_eq!(page.headers["retry-after"], "60");
    // A minute later the account may try again.
    app.clock.advance(Duration::from_secs(61));
    assert_eq!(browser.sign_in(email, PASSWORD).await.status, 303);

    // Per address: attempts on many accounts from one address.
    let mut refused = None;
    for i in 0..25 {
        let page = browser
            .sign_in(&format!("nobody{i}@x.example"), "guess")
            .await;
        if page.status == 429 {
            refused = Some((i, page.body));
            break;
        }
        assert_eq!(page.status, 401);
    }
    let (at, body) = refused.expect("25 attempts from one address were never throttled");
    // One attempt of this minute was the successful sign-in above.
    assert_eq!(at, 19, "refused at attempt {at}");
    assert!(body.contains("from this address (20 per minute)"), "{body}");
}

#[tokio::test]
async fn an_expired_sign_in_link_is_refused() {
    let app = spawn_app("dash-expired").await;
    let link = create_account(&app.data_dir, "late", "owner@late.example", "pro", &app.api);
    // The link was made on the real clock and lives 24 h.
    app.clock
        .set(Timestamp(Timestamp::now().0 + 24 * 3_600_000 + 60_000));
    let mut browser = Browser::new(&app.api);
    let page = browser.set_password(&link, PASSWORD).await;
    assert_eq!(page.status, 410, "{}", page.body);
    assert!(
        page.body.contains("expired or was already used"),
        "{}",
        page.body
    );
    assert!(browser.get("/dashboard").await.location() == Some("/dashboard/sign-in"));
}

#[tokio::test]
async fn keys_made_in_the_dashboard_are_listed_with_their_organization_and_usage_and_rotate() {
    let app = spawn_app("dash-keys").await;
    let mut browser = signed_in(&app, "acme", "pro").await;
    let csrf = browser.get("/dashboard").await.csrf();
    let page = browser
        .post("/dashboard/keys", &[("csrf", &csrf), ("name", "notebook")])
        .await;
    let key = between(&page.body, r#"<code class="secret" id="new-key">"#, "<").unwrap();
    let key_id = between(&page.body, r#"<tr data-key-id=""#, "\"").unwrap();
    for _ in 0..3 {
        assert_eq!(status_of(&app, "/v1/health", &key).await, 200);
    }
    assert_eq!(status_of(&app, "/v1/markets/nope", &key).await, 404);
    let page = browser.get("/dashboard").await;
    assert!(page.body.contains("notebook") && page.body.contains(&key[..12]));
    assert!(
        page.body.contains(r#"<td class="num">4</td>"#),
        "{}",
        page.body
    );
    assert!(!page.body.contains(&key), "the key is shown again");
    let usage = browser.get("/dashboard/usage").await;
    assert!(usage.body.contains(r#"id="usage-total""#));
    assert!(usage.body.contains(r#"data-total="4""#), "{}", usage.body);
    assert!(
        usage.body.contains("<title>3 2xx</title>") && usage.body.contains("<title>1 4xx</title>")
    );
    let listed = keys_cli(&app.data_dir, &["list"]);
    let line = listed.lines().find(|l| l.starts_with(&key_id)).unwrap();
    assert!(line.contains("\tacme\tpro\t"), "{line}");

    // Rotate: a new secret, the old one refused at once.
    let page = browser
        .post(
            &format!("/dashboard/keys/{key_id}/rotate"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let rotated = between(&page.body, r#"<code class="secret" id="new-key">"#, "<").unwrap();
    assert_ne!(rotated, key);
    assert_eq!(status_of(&app, "/v1/health", &key).await, 401);
    assert_eq!(status_of(&app, "/v1/health", &rotated).await, 200);
    // Another organization cannot touch it.
    let mut stranger = signed_in(&app, "other", "free").await;
    let their = stranger.get("/dashboard").await.csrf();
    let new_id = between(&page.body, r#"<tr data-key-id=""#, "\"").unwrap();
    let new_id = if new_id == key_id {
        page.body
            .match_indices(r#"<tr data-key-id=""#)
            .nth(1)
            .map(|(i, _)| between(&page.body[i..], r#"<tr data-key-id=""#, "\"").unwrap())
            .unwrap()
    } else {
        new_id
    };
    let page = stranger
        .post(
            &format!("/dashboard/keys/{new_id}/revoke"),
            &[("csrf", &their)],
        )
        .await;
    assert_eq!(page.status, 404);
    assert_eq!(status_of(&app, "/v1/health", &rotated).await, 200);
}

/// Every byte of every file of the data directory.
fn stored_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One thread: every task of the app logs to this test's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn no_password_key_link_or_session_is_stored_or_logged_in_plain_text() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let app = spawn_app("dash-secrets").await;
    let link = create_account(
        &app.data_dir,
        "vault",
        "owner@vault.example",
        "pro",
        &app.api,
    );
    let token = link.rsplit('/').next().unwrap().to_string();
    let mut browser = Browser::new(&app.api);
    assert_eq!(browser.set_password(&link, PASSWORD).await.status, 303);
    let session = browser.cookie.clone().unwrap();
    let csrf = browser.get("/dashboard").await.csrf();
    let page = browser
        .post("/dashboard/keys", &[("csrf", &csrf), ("name", "k")])
        .await;
    let key = between(&page.body, r#"<code class="secret" id="new-key">"#, "<").unwrap();
    assert_eq!(status_of(&app, "/v1/health", &key).await, 200);
    // A failed sign-in with a password-like guess is not logged either.
    let guess = "guessed password 12345";
    assert_eq!(
        browser.sign_in("owner@vault.example", guess).await.status,
        401
    );
    app.stop().await;

    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        !logs.is_empty(),
        "nothing was captured: the check would prove nothing"
    );
    let files = stored_bytes(&app_dir("dash-secrets"));
    assert!(
        files.iter().any(|(name, _)| name == "accounts.db"),
        "{:?}",
        files.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    // The stored account does hold the password's Argon2id hash.
    assert!(files.iter().any(|(_, b)| contains(b, "$argon2id$")));
    for (what, secret) in [
        ("password", PASSWORD),
        ("guessed password", guess),
        ("API key", key.as_str()),
        ("sign-in token", token.as_str()),
        ("session cookie", session.as_str()),
    ] {
        assert!(!logs.contains(secret), "the logs hold the {what}");
        for (name, bytes) in &files {
            assert!(
                !contains(bytes, secret),
                "{name} holds the {what} in plain text"
            );
        }
    }
}

/// The status of a `/v1` GET with `key`.
async fn status_of(app: &TestApp, path: &str, key: &str) -> u16 {
    get_as(app, Some(key), path).await.0
}

fn app_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("hindsight-test-{name}-{}", std::process::id()))
}

#[tokio::test]
async fn an_owner_invites_a_member_who_signs_in_with_the_link_and_shares_the_keys() {
    let app = spawn_app("dash-members").await;
    let mut owner = signed_in(&app, "team", "pro").await;
    let page = owner.get("/dashboard").await;
    assert!(page.body.contains("Invite a member"));
    let csrf = page.csrf();
    let page = owner
        .post("/dashboard/keys", &[("csrf", &csrf), ("name", "shared")])
        .await;
    let key_id = between(&page.body, r#"<tr data-key-id=""#, "\"").unwrap();
    let page = owner
        .post(
            "/dashboard/members",
            &[("csrf", &csrf), ("email", "Member@Team.example")],
        )
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let link = between(&page.body, r#"<code class="secret" id="invite-link">"#, "<").unwrap();
    assert!(
        link.starts_with(&format!("{}/dashboard/link/", app.api)),
        "{link}"
    );
    assert!(page.body.contains("member@team.example"));

    let mut member = Browser::new(&app.api);
    assert_eq!(member.set_password(&link, PASSWORD).await.status, 303);
    let page = member.get("/dashboard").await;
    assert!(page.body.contains(&format!(r#"data-key-id="{key_id}""#)));
    assert!(
        !page.body.contains("Invite a member"),
        "a member sees the invite form"
    );
    let their = page.csrf();
    let page = member
        .post(
            "/dashboard/members",
            &[("csrf", &their), ("email", "x@team.example")],
        )
        .await;
    assert_eq!(page.status, 403);
    // A user of another organization cannot be invited.
    signed_in(&app, "elsewhere", "free").await;
    let page = owner
        .post(
            "/dashboard/members",
            &[("csrf", &csrf), ("email", "owner@elsewhere.example")],
        )
        .await;
    assert!(
        page.body.contains("already has an account"),
        "{}",
        page.body
    );
    assert!(!page.body.contains(r#"id="invite-link""#));
}

/// `hindsight dev` prints the dashboard's address and a demo sign-in link
/// that signs in to the `demo` organization.
#[tokio::test]
async fn dev_prints_the_dashboard_and_a_demo_sign_in_link_that_works() {
    use std::io::{BufRead, BufReader};
    let dir = temp_dir("dash-dev");
    let mut child = hindsight()
        .args(["dev", "--no-demo", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let text = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            text += &line;
            text += "\n";
            if line.starts_with("Stop with Ctrl-C") {
                break;
            }
        }
        text
    })
    .await
    .unwrap();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("Dashboard"))
        .unwrap_or_else(|| panic!("no Dashboard line in {text}"));
    let link = line.split_whitespace().last().unwrap().to_string();
    let base = link.split("/dashboard/link/").next().unwrap().to_string();
    assert!(line.contains(&format!("{base}/dashboard ")), "{line}");
    let mut browser = Browser::new(&base);
    let page = browser.set_password(&link, PASSWORD).await;
    let signed_in = browser.get("/dashboard").await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(page.status, 303, "{}", page.body);
    assert!(
        signed_in.body.contains("demo@hindsight.local"),
        "{}",
        signed_in.body
    );
}
