"""sysfs: the PCIe link of each GPU and the Thunderbolt docks above them."""
