// The door seam is for door authors (`retries_core::door`, exempt from
// semver): the facade a user depends on does not export it.
use retries::door;

fn main() {
    let _ = door::now();
}
