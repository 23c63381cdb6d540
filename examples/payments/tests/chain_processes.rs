//! The chain example as separate processes: a client → A → (B →) a dead
//! store, one process per server, over gRPC and HTTP. `cargo test` builds the
//! example beside this test; this runs it and pins its figures: 9 and 27 store
//! calls per client call naive, 3 with the layers, no phantom call, every
//! hop's deadline within its caller's less the reserve.

use std::path::PathBuf;
use std::process::Command;

fn example() -> PathBuf {
    // target/<profile>/deps/<this test> → target/<profile>/examples/chain
    let exe = std::env::current_exe().expect("this test's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let path = profile
        .join("examples")
        .join(format!("chain{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "the chain example, built by `cargo test`, at {}",
        path.display()
    );
    path
}

#[test]
fn the_chain_of_processes_meets_its_targets() {
    let out = Command::new(example()).output().expect("run the example");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with("| gRPC") || l.starts_with("| HTTP"))
        .map(|l| {
            l.split('|')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), 8, "{text}");
    for row in &rows {
        let (hops, mode, per_call, phantoms, within) = (row[1], row[2], row[3], row[4], row[6]);
        let expected = match (hops.starts_with('3'), mode) {
            (_, "with the layers") => "3",
            (true, _) => "27",
            (false, _) => "9",
        };
        assert_eq!(per_call, expected, "{row:?}");
        assert_eq!(phantoms, "0", "{row:?}");
        assert_eq!(within, "yes", "{row:?}");
    }
}
