"""The HTTP/1.1 client and the streamed-response reader every server engine shares."""
