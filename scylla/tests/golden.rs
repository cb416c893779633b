//! Golden tests of every CQL statement: a change to a statement's text or
//! bind types is a visible diff of `tests/golden/*.txt`. After an intended
//! change: `HINDSIGHT_UPDATE_GOLDEN=1 cargo test -p hindsight-scylla --test golden`.

use hindsight_scylla::{schema, statements};

fn check(file: &str, rendered: String) {
    let path = format!("{}/tests/golden/{file}", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("HINDSIGHT_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &rendered).unwrap();
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_default();
    if golden != rendered {
        let first = golden
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b);
        panic!(
            "{file} differs from the statements the code prepares (first differing line: {first:?}):\n\
             golden:   {:?}\nrendered: {:?}",
            first.and_then(|i| golden.lines().nth(i)),
            first.and_then(|i| rendered.lines().nth(i)),
        );
    }
}

#[test]
fn prepared_statements_match_the_golden_file() {
    check("statements.txt", statements::render("hindsight"));
}

#[test]
fn migration_and_reset_statements_match_the_golden_file() {
    let repl = "{'class': 'NetworkTopologyStrategy', 'replication_factor': 3}";
    let mut out =
        String::from("# hindsight scylla migrate, on a keyspace with no recorded version\n");
    for s in schema::migration_plan(None, "hindsight", repl) {
        out += &s;
        out += ";\n";
    }
    out += "# hindsight rebuild (reset of derived tables)\n";
    for t in statements::derived_tables("hindsight") {
        out += &format!("TRUNCATE {t};\n");
    }
    check("migrate.txt", out);
}
