// tree_loop ROOT PASSES s|r: PASSES timed passes over ROOT/aNN/bNN/fNNNNN.txt (10,000 files, file i in directory
// i % 100): lstat of each (s), or open, read to the end and close (r). Build: gcc -O2 -o tree_loop tree_loop.c
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <string.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  const char*root=argv[1]; int passes=atoi(argv[2]); char mode=argv[3][0];
  static char paths[10000][256]; int n=0;
  for(int i=0;i<10000;i++){int d=i%100; snprintf(paths[n++],256,"%s/a%02d/b%02d/f%05d.txt",root,d/10,d%10,i);}
  static char buf[16384];
  for(int p=0;p<passes;p++){
    double t0=now();
    for(int i=0;i<n;i++){
      if(mode=='s'){struct stat st; if(lstat(paths[i],&st)){perror(paths[i]);return 1;}}
      else {int fd=open(paths[i],O_RDONLY); if(fd<0){perror(paths[i]);return 1;} while(read(fd,buf,sizeof buf)>0); close(fd);}
    }
    printf("%.4f\n",now()-t0);
  }
  return 0;
}
