// The program of cmake/layer_links.cmake: empty, because what it checks is the link
// of one layer's whole archive against the layers that layer lists.
int main() { return 0; }
