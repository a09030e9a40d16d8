"""The storage contract: what a recorder provides, and the records it keeps."""
