//! Compiles the NRI proto with protox (pure Rust, no protoc) into plain prost
//! messages; the ttrpc services are dispatched by hand (src/wire).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/nri/v1alpha1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
