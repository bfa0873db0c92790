//! CRI ImageService.

use crust_api::v1::image_service_server::ImageService;
use crust_api::v1::*;
use tonic::{Request, Response, Status};

use super::{Cri, ResponseStream, not_yet};

#[tonic::async_trait]
impl ImageService for Cri {
    async fn list_images(
        &self,
        _req: Request<ListImagesRequest>,
    ) -> Result<Response<ListImagesResponse>, Status> {
        not_yet!("ListImages")
    }

    type StreamImagesStream = ResponseStream<StreamImagesResponse>;

    async fn stream_images(
        &self,
        _req: Request<StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        not_yet!("StreamImages")
    }

    async fn image_status(
        &self,
        _req: Request<ImageStatusRequest>,
    ) -> Result<Response<ImageStatusResponse>, Status> {
        not_yet!("ImageStatus")
    }

    async fn pull_image(
        &self,
        _req: Request<PullImageRequest>,
    ) -> Result<Response<PullImageResponse>, Status> {
        not_yet!("PullImage")
    }

    async fn remove_image(
        &self,
        _req: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        not_yet!("RemoveImage")
    }

    async fn image_fs_info(
        &self,
        _req: Request<ImageFsInfoRequest>,
    ) -> Result<Response<ImageFsInfoResponse>, Status> {
        not_yet!("ImageFsInfo")
    }
}
