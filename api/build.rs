//! Compiles the CRI protos and crust's own admin protos with protox (pure
//! Rust), so no protoc binary is needed on the build machine, and lists
//! every gRPC method they define (`crust_api::GRPC_METHODS`).

use std::fmt::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/runtime/v1/api.proto",
        "proto/runtime/v1alpha2/api.proto",
        "proto/crust/admin/v1/images.proto",
        "proto/crust/admin/v1/daemon.proto",
        "proto/crust/admin/v1/check.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    // The full names of every method, as gRPC paths ("/pkg.Service/Method").
    let mut methods = String::from("&[\n");
    for file in &fds.file {
        for service in &file.service {
            for method in &service.method {
                writeln!(
                    methods,
                    "    \"/{}.{}/{}\",",
                    file.package(),
                    service.name(),
                    method.name()
                )?;
            }
        }
    }
    methods.push(']');
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("grpc_methods.rs"), methods)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
