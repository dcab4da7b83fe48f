"""The end-to-end suite (make e2e): the product against real upstream components."""
