//! Compiles the CRI protos and crust's own admin protos with protox (pure
//! Rust), so no protoc binary is needed on the build machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/runtime/v1/api.proto",
        "proto/runtime/v1alpha2/api.proto",
        "proto/crust/admin/v1/images.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
