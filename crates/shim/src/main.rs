//! `crust-shim`: the per-container monitor. See `crust_shim::monitor`.

fn main() {
    std::process::exit(crust_shim::monitor::main());
}
